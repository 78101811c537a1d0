"""attention_unpermute_backward: dout (B, T, C) -> dinp (B, NH, T, HS), the inverse of unpermute.

Inputs: ``dout`` (B, T, C) float32, ``NH`` (a Python int). Output: ``dinp`` (B, NH, T, HS) float32,
dinp[b, h, t, d] = dout[b, t, h*HS + d], assigned (the trainer's convention, not +=). Exact copy.
"""

from __future__ import annotations

import numpy as np

from ._attention import as_int, elementwise
from ._op import ALL_BLOCK_SIZES, Bound, Op, Version, check_float32, kernel_of, kernels_only, need
from .attention_permute import (ATTENTION_SIZES, FP32_EPS, LAYOUT_SIM_SIZES, LAYOUT_TEST_SHAPES,
                                LAYOUT_TOLERANCE_NOTE, layout_sizes)

SOURCE = "permute.cu"


def _shape(a):
    dout = a["dout"]
    check_float32("attention_unpermute_backward", dout=dout)
    need(dout.ndim == 3, f"attention_unpermute_backward: dout must be 3-D (B, T, C), got shape {dout.shape}")
    B, T, C = dout.shape
    NH = as_int(a["NH"], "attention_unpermute_backward: NH")
    need(NH >= 1 and C % NH == 0, f"attention_unpermute_backward: C = {C} must be a multiple of NH = {NH}")
    return B, T, C, NH


def reference(dout, NH):
    B, T, C = dout.shape
    NH = int(NH)
    return {"dinp": np.ascontiguousarray(dout.reshape(B, T, NH, C // NH).transpose(0, 2, 1, 3)).astype(np.float32)}


def make_inputs(rng, B, T, C, NH):
    return {"dout": rng.uniform(-1.0, 1.0, size=(B, T, C)).astype(np.float32), "NH": int(NH)}


def validate(a):
    _shape(a)


def allocate(xp, a):
    B, T, C, NH = _shape(a)
    return {"dinp": xp.empty((B, NH, T, C // NH), dtype=np.float32)}


def launch_unpermute_backward(dinp, dout, bs: int) -> None:
    """dinp (B, NH, T, HS) = dout (B, T, C) regrouped by head."""
    B, NH, T, HS = dinp.shape
    elementwise(kernel_of("attention_unpermute_backward", "attention_unpermute_backward_kernel1"),
                B * NH * T * HS, bs, (dinp, dout, np.int32(B), np.int32(T), np.int32(NH), np.int32(HS)))


@kernels_only
def _launch_v1(a, bs):
    launch_unpermute_backward(a["dinp"], a["dout"], bs)


OP = Op(
    name="attention_unpermute_backward",
    summary="inverse of unpermute: dout (B, T, C) -> dinp (B, NH, T, HS)",
    source=SOURCE,
    inputs=("dout", "NH"),
    outputs=("dinp",),
    versions={
        1: Version(1, "one thread per dinp element (coalesced writes), gathering from dout", _launch_v1,
                   block_sizes=ALL_BLOCK_SIZES),
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
    sizes_of=lambda a: layout_sizes(*_shape(a)),
    bound=Bound("memory", bytes=lambda s: 2 * s["B"] * s["T"] * s["C"] * 4),
)
