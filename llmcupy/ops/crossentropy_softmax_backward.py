"""crossentropy_softmax_backward: dlogits += (probs - onehot(targets)) * dlosses, accumulated.

Call::

    dlogits = llmcupy.ops["crossentropy_softmax_backward"](probs, targets, dlosses, dlogits)

``probs``: float32 (B, T, V) (or any (..., V)); ``targets``: int32 of shape ``probs.shape[:-1]``
with every id in [0, V) (checked, OpError otherwise); ``dlosses``: float32 of the same shape as
``targets``; ``dlogits``: float32 of the shape of ``probs``, updated **in place** with += and
returned (zero it first for a plain gradient).
"""

from __future__ import annotations

import numpy as np

from ._op import ALL_BLOCK_SIZES, Bound, Op, Version, check_float32, kernel_of, kernels_only, need
from .crossentropy_forward import check_targets, row_sizes

SOURCE = "crossentropy_softmax_backward.cu"
NAME = "crossentropy_softmax_backward"


def reference(probs, targets, dlosses, dlogits):
    probs = probs.astype(np.float32)
    onehot = np.zeros_like(probs)
    np.put_along_axis(onehot, targets.astype(np.int64)[..., None], np.float32(1.0), axis=-1)
    grad = (probs - onehot) * dlosses.astype(np.float32)[..., None]
    return {"dlogits": (dlogits.astype(np.float32) + grad).astype(np.float32)}


def make_inputs(rng, B, T, V):
    # llm.c's harness: probs uniform in [0, 1] (not normalised), targets uniform in [0, V), dlosses
    # uniform in [-1, 1]. It starts dlogits at zero; here it starts at uniform [-1, 1] values so the
    # test also proves that the kernel accumulates rather than overwrites.
    probs = rng.uniform(0.0, 1.0, size=(B, T, V)).astype(np.float32)
    targets = rng.integers(0, V, size=(B, T)).astype(np.int32)
    dlosses = rng.uniform(-1.0, 1.0, size=(B, T)).astype(np.float32)
    dlogits = rng.uniform(-1.0, 1.0, size=(B, T, V)).astype(np.float32)
    return {"probs": probs, "targets": targets, "dlosses": dlosses, "dlogits": dlogits}


def validate(a):
    probs, dlosses, dlogits = a["probs"], a["dlosses"], a["dlogits"]
    check_float32(NAME, probs=probs, dlosses=dlosses, dlogits=dlogits)
    need(probs.ndim >= 2, f"{NAME}: probs must be (B, T, V) or (N, V), got shape {tuple(probs.shape)}")
    need(dlosses is not None, f"{NAME}: dlosses is required")
    need(dlogits is not None, f"{NAME}: dlogits (accumulated in place) is required")
    need(tuple(dlogits.shape) == tuple(probs.shape),
         f"{NAME}: dlogits must have the shape of probs {tuple(probs.shape)}, got {tuple(dlogits.shape)}")
    need(tuple(dlosses.shape) == tuple(probs.shape[:-1]),
         f"{NAME}: dlosses must have shape {tuple(probs.shape[:-1])}, got {tuple(dlosses.shape)}")
    check_targets(NAME, a["targets"], probs.shape[-1], probs.shape[:-1])


def allocate(xp, a):
    return {"dlogits": a["dlogits"]}  # accumulated in place


@kernels_only
def _launch_v1(a, bs):
    s = row_sizes(a)
    total = s["N"] * s["V"]
    kernel = kernel_of(NAME, "crossentropy_softmax_backward_kernel1")
    # the kernel sees the rows as B = 1 batch of T = N positions: only the product matters
    kernel(((total + bs - 1) // bs,), (bs,),
           (a["dlogits"], a["dlosses"], a["probs"], a["targets"], np.int32(1), np.int32(s["N"]),
            np.int32(s["V"])))


def _requires_v1(a, bs):
    s = row_sizes(a)
    n, v = s["N"], s["V"]
    if n >= 2**31:
        return f"B*T = {n} rows overflow the kernel's 32-bit row count"
    if (n * v + bs - 1) // bs >= 2**31:
        return f"B*T*V = {n * v} elements need more than 2^31 - 1 blocks of {bs} threads"
    return None


OP = Op(
    name=NAME,
    summary="dlogits += (probs - onehot(targets)) * dlosses (softmax + cross-entropy backward)",
    source=SOURCE,
    inputs=("probs", "targets", "dlosses", "dlogits"),
    outputs=("dlogits",),
    versions={
        1: Version(1, "elementwise over B*T*V: one thread per logit, row by div/mod, broadcast dloss/target",
                   _launch_v1, block_sizes=ALL_BLOCK_SIZES, requires=_requires_v1),
    },
    default_version=1,
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=validate,
    sizes={"B": 8, "T": 1024, "V": 50257},
    sim_sizes={"B": 2, "T": 8, "V": 1000},
    test_shapes=[{"B": 1, "T": 1, "V": 7}, {"B": 1, "T": 5, "V": 37}, {"B": 3, "T": 7, "V": 1000},
                 {"B": 1, "T": 1, "V": 50257}],
    tolerance={"dlogits": (1e-5, float(np.finfo(np.float32).eps))},
    tolerance_note=(
        "llm.c's check, 1e-5 + FLT_EPSILON*|ref|: per element one subtraction, one multiply and one add "
        "on values of magnitude <= 2; a fused multiply-add changes the result by at most one rounding "
        "(~2.4e-7), far inside 1e-5."
    ),
    sizes_of=row_sizes,
    # probs read, dlogits read and written, plus one target id and one dloss per row
    bound=Bound("memory", bytes=lambda s: 12 * s["N"] * s["V"] + 8 * s["N"]),
)
