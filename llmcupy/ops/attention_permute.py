"""attention_permute: packed QKV (B, T, 3C) -> qkvr = q, k, v, each (B, NH, T, HS), back to back.

Inputs: ``inp`` (B, T, 3C) float32 = (B, T, 3, NH, HS); ``NH`` the number of heads (a Python int).
Output: ``qkvr`` (3, B, NH, T, HS) float32, qkvr[0] = q, qkvr[1] = k, qkvr[2] = v (the trainer's
``qkvr`` buffer: three B*T*C blocks at offsets 0, B*T*C, 2*B*T*C). Exact copy.
"""

from __future__ import annotations

import numpy as np

from ._attention import check_packed_qkv, elementwise, packed_qkv, split_qkv
from ._op import ALL_BLOCK_SIZES, Bound, Op, Version, kernel_of, kernels_only

SOURCE = "permute.cu"
FP32_EPS = float(np.finfo(np.float32).eps)
ATTENTION_SIZES = {"B": 8, "T": 1024, "C": 768, "NH": 12}
LAYOUT_SIM_SIZES = {"B": 2, "T": 8, "C": 48, "NH": 4}
LAYOUT_TEST_SHAPES = [{"B": 1, "T": 1, "C": 3, "NH": 1}, {"B": 2, "T": 7, "C": 20, "NH": 4},
                      {"B": 3, "T": 33, "C": 24, "NH": 2}, {"B": 1, "T": 5, "C": 96, "NH": 12}]
LAYOUT_TOLERANCE_NOTE = "llm.c's check, 1e-5 + FLT_EPSILON*|ref|; the kernel is a pure copy, so any difference is a bug."


def reference(inp, NH):
    q, k, v = split_qkv(inp, int(NH))
    return {"qkvr": np.ascontiguousarray(np.stack([q, k, v])).astype(np.float32)}


def make_inputs(rng, B, T, C, NH):
    return {"inp": packed_qkv(rng, B, T, C), "NH": int(NH)}


def validate(a):
    check_packed_qkv("attention_permute", a["inp"], a["NH"])


def allocate(xp, a):
    B, T, C, NH = check_packed_qkv("attention_permute", a["inp"], a["NH"])
    return {"qkvr": xp.empty((3, B, NH, T, C // NH), dtype=np.float32)}


def launch_permute(qkvr, inp, NH: int, bs: int) -> None:
    """The trainer's permute kernel: fills qkvr (3, B, NH, T, HS) from inp (B, T, 3C)."""
    B, T, C3 = inp.shape
    HS = C3 // 3 // NH
    elementwise(kernel_of("attention_permute", "attention_permute_kernel1"), B * NH * T * HS, bs,
                (qkvr[0], qkvr[1], qkvr[2], inp, np.int32(B), np.int32(T), np.int32(NH), np.int32(HS)))


@kernels_only
def _launch_v1(a, bs):
    _, _, _, NH = check_packed_qkv("attention_permute", a["inp"], a["NH"])
    launch_permute(a["qkvr"], a["inp"], NH, bs)


def layout_sizes(B, T, C, NH):
    return {"B": int(B), "T": int(T), "C": int(C), "NH": int(NH)}


OP = Op(
    name="attention_permute",
    summary="packed QKV (B, T, 3C) -> q, k, v (B, NH, T, HS) back to back in qkvr",
    source=SOURCE,
    inputs=("inp", "NH"),
    outputs=("qkvr",),
    versions={
        1: Version(1, "one thread per output element (coalesced writes), streaming loads of q, k, v",
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
    tolerance={"qkvr": (1e-5, FP32_EPS)},
    tolerance_note=LAYOUT_TOLERANCE_NOTE,
    sizes_of=lambda a: layout_sizes(*check_packed_qkv("attention_permute", a["inp"], a["NH"])),
    bound=Bound("memory", bytes=lambda s: 2 * 3 * s["B"] * s["T"] * s["C"] * 4),
)
