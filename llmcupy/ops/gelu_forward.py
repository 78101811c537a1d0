"""gelu_forward: GPT-2's tanh-approximated GELU, elementwise.

``op(inp) -> out``. A preallocated output can be given to ``op.run(version, {"inp": x, "out": o})``.
"""

from __future__ import annotations

import numpy as np

from ._elementwise import check_elementwise, elementwise_launch, float4_problem
from ._op import Bound, Op, Version

SOURCE = "gelu_forward.cu"


def reference(inp):
    # the formula of llm.c's CPU reference, evaluated in float64 and rounded once
    x = inp.astype(np.float64)
    k = np.sqrt(2.0 / np.pi)
    out = 0.5 * x * (1.0 + np.tanh(k * (x + 0.044715 * x * x * x)))
    return {"out": out.astype(np.float32)}


def make_inputs(rng, B, T, C):
    # the harness's distribution: uniform in [-1, 1]
    return {"inp": rng.uniform(-1.0, 1.0, size=(B, T, C)).astype(np.float32)}


def validate(a):
    check_elementwise("gelu_forward", a, out="out", inputs=("inp",))


def allocate(xp, a):
    out = a.get("out")
    return {"out": out if out is not None else xp.empty(a["inp"].shape, dtype=xp.float32)}


def _launch(name, per_thread):
    # kernel arguments (out, inp, N); per_thread = 1 (one element) or 4 (one float4 pack)
    return elementwise_launch("gelu_forward", name, per_thread, out="out", inputs=("inp",))


def _requires_packed(a, bs):
    return float4_problem(a, out="out", inputs=("inp",))


OP = Op(
    name="gelu_forward",
    summary="tanh-approximated GELU, elementwise (the MLP activation)",
    source=SOURCE,
    inputs=("inp",),
    outputs=("out",),
    versions={
        1: Version(1, "one thread per element", _launch("gelu_forward_kernel1", 1), default_block_size=128),
        2: Version(2, "one thread per float4 pack: streaming 128-bit load, cacheable 128-bit store (N % 4 == 0)",
                   _launch("gelu_forward_kernel2", 4), requires=_requires_packed, default_block_size=512),
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
        "llm.c's fp32 tolerance (1e-5 + FLT_EPSILON*|ref|). |gelu(x)| <= 1 on the [-1, 1] inputs; fp32 evaluation "
        "(a cube, a few products and tanh from the fast exponential, within ~1e-6 of tanh under --use_fast_math) stays "
        "below 1e-6 absolute against the float64 reference. Not tanhf, which NVRTC 12.8+ compiles to tanh.approx.f32 "
        "under --use_fast_math (relative error up to 2^-11, 1.7e-4 of GELU at x = 1): kernels_cu/common.cuh, "
        "tanh_from_exp."
    ),
    sizes_of=lambda a: {"N": a["inp"].size},
    bound=Bound("memory", bytes=lambda s: 2 * s["N"] * 4),
)
