"""attention_permute_backward: dq, dk, dv -> the packed QKV gradient, the inverse of permute.

Input: ``dqkvr`` (3, B, NH, T, HS) float32, dq, dk, dv back to back (the layout of
attention_permute's ``qkvr``). Output: ``dinp`` (B, T, 3C) float32 = (B, T, 3, NH, HS) with
dinp[b, t, i*C + h*HS + d] = dqkvr[i, b, h, t, d], assigned (the trainer's convention, not +=).
Exact copy.
"""

from __future__ import annotations

import numpy as np

from ._attention import elementwise
from ._op import ALL_BLOCK_SIZES, Bound, Op, Version, check_float32, kernel_of, kernels_only, need
from .attention_permute import (ATTENTION_SIZES, FP32_EPS, LAYOUT_SIM_SIZES, LAYOUT_TEST_SHAPES,
                                LAYOUT_TOLERANCE_NOTE, layout_sizes)

SOURCE = "permute.cu"


def reference(dqkvr):
    _, B, NH, T, HS = dqkvr.shape
    return {"dinp": np.ascontiguousarray(dqkvr.transpose(1, 3, 0, 2, 4)).reshape(B, T, 3 * NH * HS).astype(np.float32)}


def make_inputs(rng, B, T, C, NH):
    return {"dqkvr": rng.uniform(-1.0, 1.0, size=(3, B, NH, T, C // NH)).astype(np.float32)}


def validate(a):
    d = a["dqkvr"]
    check_float32("attention_permute_backward", dqkvr=d)
    need(d.ndim == 5 and d.shape[0] == 3,
         f"attention_permute_backward: dqkvr must be (3, B, NH, T, HS) (dq, dk, dv), got shape {d.shape}")


def allocate(xp, a):
    _, B, NH, T, HS = a["dqkvr"].shape
    return {"dinp": xp.empty((B, T, 3 * NH * HS), dtype=np.float32)}


def launch_permute_backward(dinp, dqkvr, bs: int) -> None:
    """dinp (B, T, 3C) from dq, dk, dv = dqkvr[0], dqkvr[1], dqkvr[2], each (B, NH, T, HS)."""
    _, B, NH, T, HS = dqkvr.shape
    elementwise(kernel_of("attention_permute_backward", "attention_permute_backward_kernel1"),
                B * NH * T * HS, bs,
                (dinp, dqkvr[0], dqkvr[1], dqkvr[2], np.int32(B), np.int32(T), np.int32(NH), np.int32(HS)))


@kernels_only
def _launch_v1(a, bs):
    launch_permute_backward(a["dinp"], a["dqkvr"], bs)


def _sizes_of(a):
    _, B, NH, T, HS = a["dqkvr"].shape
    return layout_sizes(B, T, NH * HS, NH)


OP = Op(
    name="attention_permute_backward",
    summary="inverse of attention_permute: dq, dk, dv (B, NH, T, HS) -> dinp (B, T, 3C)",
    source=SOURCE,
    inputs=("dqkvr",),
    outputs=("dinp",),
    versions={
        1: Version(1, "one thread per dq element: coalesced reads of dq, dk, dv, plain stores into dinp",
                   _launch_v1, block_sizes=ALL_BLOCK_SIZES),
    },
    default_version=1,
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=validate,
    sizes=dict(ATTENTION_SIZES),
    sim_sizes=dict(LAYOUT_SIM_SIZES),
    test_shapes=[dict(s) for s in LAYOUT_TEST_SHAPES],
    tolerance={"dinp": (1e-5, FP32_EPS)},
    tolerance_note=LAYOUT_TOLERANCE_NOTE,
    sizes_of=_sizes_of,
    bound=Bound("memory", bytes=lambda s: 2 * 3 * s["B"] * s["T"] * s["C"] * 4),
)
