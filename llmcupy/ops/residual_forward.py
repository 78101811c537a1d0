"""residual_forward: out = inp1 + inp2 elementwise, the residual connection of every block.

``op(inp1, inp2) -> out``. A preallocated output can be given to ``op.run(version, {"inp1": a,
"inp2": b, "out": o})``: it is written in place of a fresh array (same shape, float32).
"""

from __future__ import annotations

import numpy as np

from ._elementwise import check_elementwise, elementwise_launch, float4_problem
from ._op import Bound, Op, Version

SOURCE = "residual_forward.cu"


def reference(inp1, inp2):
    # llm.c's CPU reference: one fp32 addition per element (exact to the last bit)
    return {"out": (inp1.astype(np.float32) + inp2.astype(np.float32)).astype(np.float32)}


def make_inputs(rng, B, T, C):
    # the harness's distribution: both inputs uniform in [-1, 1]
    return {
        "inp1": rng.uniform(-1.0, 1.0, size=(B, T, C)).astype(np.float32),
        "inp2": rng.uniform(-1.0, 1.0, size=(B, T, C)).astype(np.float32),
    }


def validate(a):
    check_elementwise("residual_forward", a, out="out", inputs=("inp1", "inp2"))


def allocate(xp, a):
    out = a.get("out")
    return {"out": out if out is not None else xp.empty(a["inp1"].shape, dtype=xp.float32)}


def _launch(name, per_thread):
    # kernel arguments (out, inp1, inp2, N); per_thread = 1 (one element) or 4 (one float4 pack)
    return elementwise_launch("residual_forward", name, per_thread, out="out", inputs=("inp1", "inp2"))


def _requires_packed(a, bs):
    return float4_problem(a, out="out", inputs=("inp1", "inp2"))


OP = Op(
    name="residual_forward",
    summary="elementwise out = inp1 + inp2 (the residual connection)",
    source=SOURCE,
    inputs=("inp1", "inp2"),
    outputs=("out",),
    versions={
        1: Version(1, "one thread per element, scalar coalesced accesses", _launch("residual_forward_kernel1", 1)),
        2: Version(2, "one thread per float4 pack: streaming 128-bit loads, cacheable 128-bit store (N % 4 == 0)",
                   _launch("residual_forward_kernel2", 4), requires=_requires_packed),
    },
    default_version=2,
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=validate,
    sizes={"B": 8, "T": 1024, "C": 768},
    sim_sizes={"B": 2, "T": 8, "C": 64},
    test_shapes=[{"B": 1, "T": 1, "C": 4}, {"B": 2, "T": 5, "C": 12}, {"B": 3, "T": 7, "C": 37},
                 {"B": 1, "T": 3, "C": 1000}],
    tolerance={"out": (1e-5, float(np.finfo(np.float32).eps))},
    tolerance_note=(
        "llm.c's fp32 tolerance (1e-5 + FLT_EPSILON*|ref|). One fp32 addition per element, correctly rounded on "
        "both sides, so the kernels actually match the reference bit for bit."
    ),
    sizes_of=lambda a: {"N": a["inp1"].size},
    bound=Bound("memory", bytes=lambda s: 3 * s["N"] * 4),
)
