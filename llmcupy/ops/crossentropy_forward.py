"""crossentropy_forward: per-position loss -ln(probs[..., target]) from softmaxed probabilities.

Call::

    losses = llmcupy.ops["crossentropy_forward"](probs, targets)

``probs``: float32 (B, T, V) (or any (..., V), e.g. (N, V)), C-contiguous, row stride V;
``targets``: int32 with shape ``probs.shape[:-1]``, every id in [0, V) (checked: an OpError names
the first bad one); returns ``losses``: float32 with the shape of ``targets``, not averaged.
The kernel does not check that ``probs`` is normalised; a probability of 0 gives +inf.
"""

from __future__ import annotations

import numpy as np

from ._op import (ALL_BLOCK_SIZES, Bound, Op, OpError, Version, check_float32, host_checks_enabled, kernel_of,
                  kernels_only, need)

SOURCE = "crossentropy_forward.cu"
NAME = "crossentropy_forward"


def reference(probs, targets):
    p = np.take_along_axis(probs.astype(np.float32), targets.astype(np.int64)[..., None], axis=-1)[..., 0]
    with np.errstate(divide="ignore"):
        return {"losses": (-np.log(p)).astype(np.float32)}


def make_inputs(rng, B, T, V):
    # llm.c's harness: probabilities uniform in [0, 1], not normalised; targets uniform in [0, V)
    probs = rng.uniform(0.0, 1.0, size=(B, T, V)).astype(np.float32)
    targets = rng.integers(0, V, size=(B, T)).astype(np.int32)
    return {"probs": probs, "targets": targets}


def check_targets(op_name, targets, V, shape):
    """Shared by the loss ops: int32 targets of the given shape, every id in [0, V)."""
    if targets is None:
        raise OpError(f"{op_name}: targets are required")
    dtype = getattr(targets, "dtype", None)
    need(dtype == np.int32, f"{op_name}: targets must be int32 token ids, got {dtype}")
    need(tuple(targets.shape) == tuple(shape),
         f"{op_name}: targets must have shape {tuple(shape)}, got {tuple(targets.shape)}")
    if targets.size and host_checks_enabled():  # off: the caller checked them (no read-back in a graph)
        bad = (targets < 0) | (targets >= V)
        if bool(bad.any()):
            flat = int(bad.ravel().argmax())
            value = int(targets.ravel()[flat])
            raise OpError(f"{op_name}: targets must lie in [0, V={V}); found {value} at flat index {flat}")


def validate(a):
    probs = a["probs"]
    check_float32(NAME, probs=probs)
    need(probs.ndim >= 2, f"{NAME}: probs must be (B, T, V) or (N, V), got shape {tuple(probs.shape)}")
    need(probs.shape[-1] >= 1, f"{NAME}: probs must have at least one column")
    check_targets(NAME, a["targets"], probs.shape[-1], probs.shape[:-1])


def allocate(xp, a):
    return {"losses": xp.empty(a["targets"].shape, dtype=np.float32)}


def row_sizes(a):
    """Shared by the loss ops: N rows (positions) of V probabilities, from probs (..., V)."""
    probs = a["probs"]
    return {"N": int(np.prod(probs.shape[:-1])), "V": int(probs.shape[-1])}


@kernels_only
def _launch_v1(a, bs):
    s = row_sizes(a)
    kernel = kernel_of(NAME, "crossentropy_forward_kernel1")
    # the kernel sees the positions as B = 1 row of T = N positions: only the product matters
    kernel(((s["N"] + bs - 1) // bs,), (bs,),
           (a["losses"], a["probs"], a["targets"], np.int32(1), np.int32(s["N"]), np.int32(s["V"])))


def _requires_v1(a, bs):
    n = row_sizes(a)["N"]
    if n >= 2**31:
        return f"B*T = {n} positions overflow the kernel's 32-bit thread index"
    return None


OP = Op(
    name=NAME,
    summary="per-position cross-entropy loss -ln(probs[target]) from softmaxed probabilities",
    source=SOURCE,
    inputs=("probs", "targets"),
    outputs=("losses",),
    versions={
        1: Version(1, "gather + log: one thread per position reads its target's probability",
                   _launch_v1, block_sizes=ALL_BLOCK_SIZES, requires=_requires_v1),
    },
    default_version=1,
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=validate,
    sizes={"B": 8, "T": 1024, "V": 50257},
    sim_sizes={"B": 2, "T": 64, "V": 1000},
    test_shapes=[{"B": 1, "T": 1, "V": 7}, {"B": 1, "T": 37, "V": 5}, {"B": 3, "T": 101, "V": 1000},
                 {"B": 2, "T": 3, "V": 50257}],
    tolerance={"losses": (1e-5, float(np.finfo(np.float32).eps))},
    tolerance_note=(
        "llm.c's check, 1e-5 + FLT_EPSILON*|ref|: the only arithmetic is one fp32 log of the gathered "
        "value; the fast-math logf has an absolute error of about 2^-21 (5e-7) near p = 1 and a few ulp "
        "elsewhere, so the loss is within a few ulp of -ln(p) and well inside the bound."
    ),
    sizes_of=row_sizes,
    # per position: one target id read, one probability gathered, one loss written
    bound=Bound("memory", bytes=lambda s: 12 * s["N"]),
    notes="Latency-bound: one scattered 4-byte read per row of V floats; the fused classifier replaces it.",
)
