"""adamw: llm.c's fused AdamW step, in place on ``params``, ``m`` and ``v``.

Call (every argument is required; the op returns the same three arrays it updated)::

    params, m, v = llmcupy.ops["adamw"](params, grads, m, v, lr, beta1, beta2, eps, weight_decay, t)

``params``, ``grads``, ``m``, ``v``: float32 arrays of one shape (flat, P = num_parameters),
C-contiguous; ``m`` and ``v`` start at zero on the first step (the trainer allocates them lazily,
zero-filled). ``lr``, ``beta1``, ``beta2``, ``eps``, ``weight_decay``: real numbers, converted to
``np.float32`` before the launch; ``t``: the 1-based step (an int >= 1). The bias corrections
``c1 = 1 - beta1**t`` and ``c2 = 1 - beta2**t`` are computed here on the host in float32 (powf),
as llm.c does, and the kernel receives c1 and c2, not t. Per element, with theta the old value::

    m = beta1*m + (1 - beta1)*g;  v = beta2*v + (1 - beta2)*g*g
    theta -= lr * ((m / c1) / (sqrt(v / c2) + eps) + weight_decay * theta)

The fp32 trainer uses version 2 (block 512) with lr = 3e-4, beta1 = 0.9, beta2 = 0.999,
eps = 1e-8, weight_decay = 0.0, t = step + 1.
"""

from __future__ import annotations

import math

import numpy as np

from ._op import Bound, Op, OpError, Version, check_float32, kernel_of, kernels_only, need

SOURCE = "adamw.cu"
NAME = "adamw"
BLOCK_SIZE = 512  # hard-coded in llm.c's launchers and in the trainer; not swept
SCALARS = ("lr", "beta1", "beta2", "eps", "weight_decay")


def _f32(name, x) -> np.float32:
    try:
        value = float(x)
    except (TypeError, ValueError):
        raise OpError(f"{NAME}: {name} must be a real number, got {type(x).__name__}") from None
    if not math.isfinite(value):
        raise OpError(f"{NAME}: {name} must be finite, got {value}")
    return np.float32(value)


def _step(t) -> int:
    try:
        step = int(t)
    except (TypeError, ValueError):
        raise OpError(f"{NAME}: t (the 1-based step) must be an int, got {type(t).__name__}") from None
    if step != float(t) or step < 1:
        raise OpError(f"{NAME}: t (the 1-based step) must be an integer >= 1, got {t!r}")
    return step


def bias_corrections(beta1, beta2, t):
    """(c1, c2) = (1 - beta1^t, 1 - beta2^t) in float32 with powf, as llm.c's host code computes them."""
    b1, b2 = _f32("beta1", beta1), _f32("beta2", beta2)
    tt = np.float32(_step(t))
    one = np.float32(1.0)
    return np.float32(one - np.power(b1, tt)), np.float32(one - np.power(b2, tt))


def reference(params, grads, m, v, lr, beta1, beta2, eps, weight_decay, t):
    # llm.c's CPU loop, every operation in float32
    lr, b1, b2, eps, wd = (_f32(n, x) for n, x in zip(SCALARS, (lr, beta1, beta2, eps, weight_decay)))
    c1, c2 = bias_corrections(b1, b2, t)
    one = np.float32(1.0)
    g = grads.astype(np.float32)
    theta = params.astype(np.float32)
    m = (b1 * m.astype(np.float32) + (one - b1) * g).astype(np.float32)
    v = (b2 * v.astype(np.float32) + (one - b2) * g * g).astype(np.float32)
    m_hat = m / c1
    v_hat = v / c2
    theta = (theta - lr * (m_hat / (np.sqrt(v_hat) + eps) + wd * theta)).astype(np.float32)
    return {"params": theta, "m": m, "v": v}


def make_inputs(rng, P):
    # llm.c's harness: params, grads and m uniform in [-1, 1], v uniform in [0, 1] (non-negative);
    # t = 10, lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0
    return {
        "params": rng.uniform(-1.0, 1.0, size=P).astype(np.float32),
        "grads": rng.uniform(-1.0, 1.0, size=P).astype(np.float32),
        "m": rng.uniform(-1.0, 1.0, size=P).astype(np.float32),
        "v": rng.uniform(0.0, 1.0, size=P).astype(np.float32),
        "lr": np.float32(1e-3),
        "beta1": np.float32(0.9),
        "beta2": np.float32(0.999),
        "eps": np.float32(1e-8),
        "weight_decay": np.float32(0.0),
        "t": np.int32(10),
    }


def validate(a):
    for k in ("params", "grads", "m", "v"):
        need(a[k] is not None, f"{NAME}: {k} is required")
    check_float32(NAME, params=a["params"], grads=a["grads"], m=a["m"], v=a["v"])
    shape = tuple(a["params"].shape)
    for k in ("grads", "m", "v"):
        need(tuple(a[k].shape) == shape, f"{NAME}: {k} must have the shape of params {shape}, got {tuple(a[k].shape)}")
    need(a["params"].size >= 1, f"{NAME}: params is empty")
    for k in SCALARS:
        _f32(k, a[k])
    _step(a["t"])
    for k in ("beta1", "beta2"):
        b = float(a[k])
        need(0.0 <= b < 1.0, f"{NAME}: {k} must lie in [0, 1), got {b}")
    need(float(a["eps"]) >= 0.0, f"{NAME}: eps must be >= 0, got {float(a['eps'])}")
    c1, c2 = bias_corrections(a["beta1"], a["beta2"], a["t"])
    need(c1 > 0 and c2 > 0, f"{NAME}: the bias corrections 1 - beta^t must be > 0 in float32, got c1={c1}, c2={c2}")


def allocate(xp, a):
    return {"params": a["params"], "m": a["m"], "v": a["v"]}  # updated in place


def _sizes(a):
    return {"P": int(a["params"].size)}


def _launch(kernel_name):
    @kernels_only
    def launch(a, bs):
        n = int(a["params"].size)
        lr, b1, b2, eps, wd = (_f32(k, a[k]) for k in SCALARS)
        c1, c2 = bias_corrections(b1, b2, a["t"])
        kernel = kernel_of(NAME, kernel_name)
        kernel(((n + bs - 1) // bs,), (bs,),
               (a["params"], a["grads"], a["m"], a["v"], np.int64(n), lr, b1, b2, c1, c2, eps, wd))

    return launch


OP = Op(
    name=NAME,
    summary="fused AdamW step in place on params, m, v (bias corrections computed on the host)",
    source=SOURCE,
    inputs=("params", "grads", "m", "v") + SCALARS + ("t",),
    outputs=("params", "m", "v"),
    versions={
        1: Version(1, "naive: one thread per parameter, re-reads grads/m/v/params from global memory",
                   _launch("adamw_kernel1"), block_sizes=(BLOCK_SIZE,)),
        2: Version(2, "register-cached, moments as two-FMA lerps, each output written once (trainer's)",
                   _launch("adamw_kernel2"), block_sizes=(BLOCK_SIZE,)),
    },
    default_version=2,
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=validate,
    sizes={"P": 1_048_576},
    sim_sizes={"P": 20_000},
    test_shapes=[{"P": 1}, {"P": 513}, {"P": 5000}],
    tolerance={k: (1e-4, float(np.finfo(np.float32).eps)) for k in ("params", "m", "v")},
    tolerance_note=(
        "llm.c's check, 1e-4 + FLT_EPSILON*|ref|: m and v are one fp32 multiply-add each (|m| <= 1, "
        "0 <= v <= 1), so an FMA or the lerp form changes them by about one ulp (1e-7); the parameter "
        "moves by at most lr * |m_hat / (sqrt(v_hat) + eps)| ~ 1e-3 * 3, and fast-math sqrt/divide errors "
        "of a few ulp on that step are ~1e-9, all far inside the bound."
    ),
    sizes_of=_sizes,
    # params, grads, m, v read; params, m, v written
    bound=Bound("memory", bytes=lambda s: 28 * s["P"]),
    notes="Block size fixed at 512 as in llm.c (no sweep). Scalars are passed to the kernel as np.float32.",
)
