"""attention_unpermute: the attention output (B, NH, T, HS) -> (B, T, C) in row order.

Input: ``inp`` (B, NH, T, HS) float32 (the heads' outputs y = att @ v). Output: ``out`` (B, T, C)
float32 with out[b, t, h*HS + d] = inp[b, h, t, d]. Exact copy.
"""

from __future__ import annotations

import numpy as np

from ._attention import elementwise
from ._op import ALL_BLOCK_SIZES, Bound, Op, Version, check_float32, kernel_of, kernels_only, need
from .attention_permute import (ATTENTION_SIZES, FP32_EPS, LAYOUT_SIM_SIZES, LAYOUT_TEST_SHAPES,
                                LAYOUT_TOLERANCE_NOTE, layout_sizes)

SOURCE = "permute.cu"


def reference(inp):
    B, NH, T, HS = inp.shape
    return {"out": np.ascontiguousarray(inp.transpose(0, 2, 1, 3)).reshape(B, T, NH * HS).astype(np.float32)}


def make_inputs(rng, B, T, C, NH):
    return {"inp": rng.uniform(-1.0, 1.0, size=(B, NH, T, C // NH)).astype(np.float32)}


def validate(a):
    check_float32("attention_unpermute", inp=a["inp"])
    need(a["inp"].ndim == 4, f"attention_unpermute: inp must be 4-D (B, NH, T, HS), got shape {a['inp'].shape}")


def allocate(xp, a):
    B, NH, T, HS = a["inp"].shape
    return {"out": xp.empty((B, T, NH * HS), dtype=np.float32)}


def launch_unpermute(out, inp, bs: int) -> None:
    """The trainer's unpermute kernel: out (B, T, C) from inp (B, NH, T, HS)."""
    B, NH, T, HS = inp.shape
    elementwise(kernel_of("attention_unpermute", "attention_unpermute_kernel1"), B * NH * T * HS, bs,
                (out, inp, np.int32(B), np.int32(T), np.int32(NH), np.int32(HS)))


@kernels_only
def _launch_v1(a, bs):
    launch_unpermute(a["out"], a["inp"], bs)


def _sizes_of(a):
    B, NH, T, HS = a["inp"].shape
    return layout_sizes(B, T, NH * HS, NH)


OP = Op(
    name="attention_unpermute",
    summary="attention output (B, NH, T, HS) -> (B, T, C)",
    source=SOURCE,
    inputs=("inp",),
    outputs=("out",),
    versions={
        1: Version(1, "one thread per input element, streaming loads; writes in runs of HS", _launch_v1,
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
    tolerance={"out": (1e-5, FP32_EPS)},
    tolerance_note=LAYOUT_TOLERANCE_NOTE,
    sizes_of=_sizes_of,
    bound=Bound("memory", bytes=lambda s: 2 * s["B"] * s["T"] * s["C"] * 4),
)
