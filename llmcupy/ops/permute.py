"""permute: llm.c's 4-D permute demo, (d1, d2, d3, d4) -> (d4, d3, d1, d2), an exact copy.

The attention layout kernels of the same spec (permute.md) are the ops attention_permute,
attention_unpermute, attention_permute_backward and attention_unpermute_backward; all five share
kernels_cu/permute.cu.
"""

from __future__ import annotations

import numpy as np

from ._op import ALL_BLOCK_SIZES, Bound, Op, Version, check_float32, kernel_of, kernels_only, need

SOURCE = "permute.cu"


def reference(inp):
    return {"out": np.ascontiguousarray(np.transpose(inp, (3, 2, 0, 1))).astype(np.float32)}


def make_inputs(rng, d1, d2, d3, d4):
    return {"inp": rng.uniform(-1.0, 1.0, size=(d1, d2, d3, d4)).astype(np.float32)}


def validate(a):
    check_float32("permute", inp=a["inp"])
    need(a["inp"].ndim == 4, f"permute: inp must be 4-D (d1, d2, d3, d4), got shape {a['inp'].shape}")
    need(a["inp"].size < 2**31, f"permute: {a['inp'].size} elements overflow the kernel's 32-bit indices")


def allocate(xp, a):
    d1, d2, d3, d4 = a["inp"].shape
    return {"out": xp.empty((d4, d3, d1, d2), dtype=np.float32)}


@kernels_only
def _launch_v1(a, bs):
    d1, d2, d3, d4 = a["inp"].shape
    n = d1 * d2 * d3 * d4
    kernel_of("permute", "permute_kernel1")(
        ((n + bs - 1) // bs,), (bs,), (a["out"], a["inp"], np.int32(d1), np.int32(d2), np.int32(d3), np.int32(d4))
    )


OP = Op(
    name="permute",
    summary="4-D permute demo: (d1, d2, d3, d4) -> (d4, d3, d1, d2), exact copy",
    source=SOURCE,
    inputs=("inp",),
    outputs=("out",),
    versions={
        1: Version(1, "one thread per input element: coalesced reads, scattered writes", _launch_v1,
                   block_sizes=ALL_BLOCK_SIZES),
    },
    default_version=1,
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=validate,
    sizes={"d1": 24, "d2": 42, "d3": 20, "d4": 32},
    sim_sizes={"d1": 3, "d2": 5, "d3": 4, "d4": 7},
    test_shapes=[{"d1": 1, "d2": 1, "d3": 1, "d4": 1}, {"d1": 3, "d2": 5, "d3": 7, "d4": 11},
                 {"d1": 2, "d2": 1, "d3": 9, "d4": 33}, {"d1": 24, "d2": 4, "d3": 3, "d4": 8}],
    tolerance={"out": (1e-5, float(np.finfo(np.float32).eps))},
    tolerance_note="llm.c's check, 1e-5 + FLT_EPSILON*|ref|; the kernel is a pure copy, so any difference is a bug.",
    sizes_of=lambda a: {"N": int(a["inp"].size)},
    bound=Bound("memory", bytes=lambda s: 2 * s["N"] * 4),
)
