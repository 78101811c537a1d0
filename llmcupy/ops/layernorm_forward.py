"""layernorm_forward: LayerNorm over the channels of (B, T, C), saving mean and rstd for backward."""

from __future__ import annotations

import numpy as np

from ..runtime import backend as _backend
from ..runtime import module as _module
from ._op import Bound, Op, Version, check_float32, kernel_of, kernels_only, misaligned, need

SOURCE = "layernorm_forward.cu"
EPS = 1e-5
NORMALIZATION_BLOCK = 256  # version 2's elementwise kernel always runs 256-thread blocks


def reference(inp, weight, bias):
    # llm.c's CPU reference: mean, then the centred (biased) variance, then normalise. Accumulated
    # in float64 here, so the reference is closer to exact than any fp32 kernel.
    x = inp.astype(np.float64)
    m = x.mean(axis=-1, keepdims=True)
    v = ((x - m) ** 2).mean(axis=-1, keepdims=True)
    s = 1.0 / np.sqrt(v + EPS)
    out = (x - m) * s * weight.astype(np.float64) + bias.astype(np.float64)
    return {"out": out.astype(np.float32), "mean": m[..., 0].astype(np.float32), "rstd": s[..., 0].astype(np.float32)}


def make_inputs(rng, B, T, C):
    # as in llm.c's harness: everything uniform in [-1, 1]
    return {
        "inp": rng.uniform(-1.0, 1.0, size=(B, T, C)).astype(np.float32),
        "weight": rng.uniform(-1.0, 1.0, size=(C,)).astype(np.float32),
        "bias": rng.uniform(-1.0, 1.0, size=(C,)).astype(np.float32),
    }


def validate(a):
    check_float32("layernorm_forward", inp=a["inp"], weight=a["weight"], bias=a["bias"])
    inp = a["inp"]
    need(inp.ndim >= 2, f"layernorm_forward: inp must be (B, T, C) or (N, C), got shape {inp.shape}")
    c = inp.shape[-1]
    need(c >= 1 and inp.size >= 1, f"layernorm_forward: inp must not be empty, got shape {inp.shape}")
    for k in ("weight", "bias"):
        need(a[k].shape == (c,), f"layernorm_forward: {k} must have shape ({c},) to match inp's C, got {a[k].shape}")


def allocate(xp, a):
    inp = a["inp"]
    return {
        "out": xp.empty_like(inp),
        "mean": xp.empty(inp.shape[:-1], dtype=np.float32),
        "rstd": xp.empty(inp.shape[:-1], dtype=np.float32),
    }


def _nc(a):
    c = a["inp"].shape[-1]
    return a["inp"].size // c, c


def _args(a):
    n, c = _nc(a)
    return (a["out"], a["mean"], a["rstd"], a["inp"], a["weight"], a["bias"], np.int32(n), np.int32(c))


def _kernel(name):
    return kernel_of("layernorm_forward", name)


@kernels_only
def _launch_v1(a, bs):
    n, _ = _nc(a)
    _kernel("layernorm_forward_kernel1")(((n + bs - 1) // bs,), (bs,), _args(a))


@kernels_only
def _launch_v2(a, bs):
    n, c = _nc(a)
    _kernel("layernorm_forward_mean_kernel2")((n,), (bs,), (a["mean"], a["inp"], np.int32(n), np.int32(c)),
                                             shared_mem=4 * bs)
    _kernel("layernorm_forward_rstd_kernel2")((n,), (bs,),
                                             (a["rstd"], a["inp"], a["mean"], np.int32(n), np.int32(c)),
                                             shared_mem=4 * bs)
    grid = (n * c + NORMALIZATION_BLOCK - 1) // NORMALIZATION_BLOCK
    _kernel("layernorm_forward_normalization_kernel2")(
        (grid,), (NORMALIZATION_BLOCK,),
        (a["out"], a["inp"], a["mean"], a["rstd"], a["weight"], a["bias"], np.int32(n), np.int32(c)))


def _warp_per_row(name):
    @kernels_only
    def launch(a, bs):
        n, _ = _nc(a)
        _kernel(name)(((n * 32 + bs - 1) // bs,), (bs,), _args(a))

    return launch


@kernels_only
def _launch_v5(a, bs):
    n, _ = _nc(a)
    _kernel("layernorm_forward_kernel5")((n,), (bs,), _args(a))


def _max_dynamic_shared() -> int:
    """The per-block opt-in shared memory limit of the device (the emulator's on ``sim``)."""
    if _backend.is_sim():
        return _module.ANY_GPU_SHARED_BYTES   # the emulator refuses more, like the largest GPUs
    return _backend.device_attribute("MaxSharedMemoryPerBlockOptin")  # cached: no query per launch


def _v6_shared_bytes(c, bs):
    return (2 + bs // 32) * c * 4


@kernels_only
def _launch_v6(a, bs):
    n, c = _nc(a)
    smem = _v6_shared_bytes(c, bs)
    if smem > _max_dynamic_shared():
        _launch_v5(a, bs)  # as llm.c: too much shared memory for this device, fall back to version 5
        return
    rows = bs // 32
    _kernel("layernorm_forward_kernel6")(((n + rows - 1) // rows,), (32, rows), _args(a), shared_mem=smem)


def _requires_v6(a, bs):
    c = a["inp"].shape[-1]
    if c % 4:
        return f"C = {c} must be a multiple of 4 (rows are read and written as float4)"
    return misaligned(a, ("inp", "weight", "bias"), use="float4 loads")


OP = Op(
    name="layernorm_forward",
    summary="LayerNorm over the channels of (B, T, C), saving mean and rstd",
    source=SOURCE,
    inputs=("inp", "weight", "bias"),
    outputs=("out", "mean", "rstd"),
    versions={
        1: Version(1, "naive: one thread per row, mean / variance / normalise passes", _launch_v1),
        2: Version(2, "three kernels: block-per-row tree reductions for mean and rstd, then one thread per "
                      "element (fixed block 256, tail masked)", _launch_v2),
        3: Version(3, "one warp per row, cg::reduce, exact two-pass variance, streaming hints (the trainer's)",
                   _warp_per_row("layernorm_forward_kernel3"), default_block_size=512),
        4: Version(4, "one warp per row, one read pass: var = E[x^2] - mean^2",
                   _warp_per_row("layernorm_forward_kernel4")),
        5: Version(5, "one block per row, single-pass variance, warp partials in static shared memory",
                   _launch_v5),
        6: Version(6, "one warp per row, weight/bias/row staged in dynamic shared memory, float4 streaming "
                      "loads and stores (C % 4 == 0; falls back to 5 when shared memory is too small)",
                   _launch_v6, requires=_requires_v6),
    },
    default_version=6,
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=validate,
    sizes={"B": 8, "T": 1024, "C": 768},
    sim_sizes={"B": 2, "T": 8, "C": 768},
    test_shapes=[{"B": 1, "T": 1, "C": 64}, {"B": 2, "T": 3, "C": 100}, {"B": 1, "T": 5, "C": 37},
                 {"B": 1, "T": 3, "C": 768}],
    tolerance={
        "out": (1e-5, float(np.finfo(np.float32).eps)),
        "mean": (1e-5, float(np.finfo(np.float32).eps)),
        "rstd": (1e-5, float(np.finfo(np.float32).eps)),
    },
    tolerance_note=(
        "llm.c's tolerance for all three outputs: 1e-5 absolute plus one fp32 epsilon relative. Inputs are "
        "uniform in [-1, 1], so the row sums of C <= 768 fp32 terms carry rounding errors around 1e-7 relative "
        "(mean within ~1e-8 absolute), rstd ~ 1.7 is off by a few ulp (rsqrtf), and out = n*w + b with "
        "|out| < 3 inherits that ~1e-6 relative error: all well inside 1e-5. The single-pass variance of "
        "versions 4 and 5 loses little here because |mean| << std for such rows."
    ),
    sizes_of=lambda a: {"N": _nc(a)[0], "C": _nc(a)[1]},
    # x read and out written once, plus weight and bias read and mean and rstd written
    bound=Bound("memory", bytes=lambda s: 4 * (2 * s["N"] * s["C"] + 2 * s["C"] + 2 * s["N"])),
)
