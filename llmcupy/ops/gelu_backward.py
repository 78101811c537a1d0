"""gelu_backward: dinp = GELU'(inp) * dout elementwise (overwritten, not accumulated).

``op(inp, dout) -> dinp``. The kernels are safe in place, as the trainer uses them: pass the output
buffer explicitly with ``op.run(version, {"inp": x, "dout": g, "dinp": g})`` and ``g`` is
overwritten with the input gradient.
"""

from __future__ import annotations

import numpy as np

from ._elementwise import check_elementwise, elementwise_launch, float4_problem
from ._op import Bound, Op, Version

SOURCE = "gelu_backward.cu"


def gelu_grad64(x):
    """GELU'(x) of the tanh approximation in float64 (the formula of llm.c's CPU reference)."""
    x = np.asarray(x, dtype=np.float64)
    k = np.sqrt(2.0 / np.pi)
    u = k * (x + 0.044715 * x * x * x)
    with np.errstate(over="ignore"):
        sech2 = 1.0 / np.cosh(u) ** 2  # cosh overflows to inf for huge |u|: the term is then 0
    return 0.5 * (1.0 + np.tanh(u)) + x * 0.5 * sech2 * k * (1.0 + 3.0 * 0.044715 * x * x)


def reference(inp, dout):
    return {"dinp": (gelu_grad64(inp) * dout.astype(np.float64)).astype(np.float32)}


def make_inputs(rng, B, T, C):
    # the harness's distribution: x and dout uniform in [-1, 1]
    return {
        "inp": rng.uniform(-1.0, 1.0, size=(B, T, C)).astype(np.float32),
        "dout": rng.uniform(-1.0, 1.0, size=(B, T, C)).astype(np.float32),
    }


def validate(a):
    check_elementwise("gelu_backward", a, out="dinp", inputs=("inp", "dout"))


def allocate(xp, a):
    dinp = a.get("dinp")  # may be dout itself (in place)
    return {"dinp": dinp if dinp is not None else xp.empty(a["inp"].shape, dtype=xp.float32)}


def _launch(name, per_thread):
    # kernel arguments (dinp, inp, dout, N); per_thread = 1 (one element) or 4 (one float4 pack)
    return elementwise_launch("gelu_backward", name, per_thread, out="dinp", inputs=("inp", "dout"))


def _requires_packed(a, bs):
    return float4_problem(a, out="dinp", inputs=("inp", "dout"))


OP = Op(
    name="gelu_backward",
    summary="dinp = GELU'(inp) * dout, elementwise, overwriting (safe in place on dout)",
    source=SOURCE,
    inputs=("inp", "dout"),
    outputs=("dinp",),
    versions={
        1: Version(1, "one thread per element", _launch("gelu_backward_kernel1", 1), default_block_size=128),
        2: Version(2, "one thread per float4 pack: streaming 128-bit loads, plain 128-bit store (N % 4 == 0)",
                   _launch("gelu_backward_kernel2", 4), requires=_requires_packed, default_block_size=128),
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
    tolerance={"dinp": (1e-5, float(np.finfo(np.float32).eps))},
    tolerance_note=(
        "llm.c's fp32 tolerance (1e-5 + FLT_EPSILON*|ref|). On [-1, 1] inputs GELU' lies in about [-0.1, 1.13] and "
        "|dout| <= 1; the fp32 evaluation (tanh from the fast exponential, within ~1e-6 of tanh; coshf, a reciprocal "
        "and ~10 products, a few ulp each under --use_fast_math) errs by under 1e-6 against the float64 reference. "
        "Not tanhf, which NVRTC 12.8+ compiles to tanh.approx.f32 under --use_fast_math (relative error up to 2^-11, "
        "~1e-4 here): kernels_cu/common.cuh, tanh_from_exp."
    ),
    sizes_of=lambda a: {"N": a["inp"].size},
    bound=Bound("memory", bytes=lambda s: 3 * s["N"] * 4),
)
