"""matmul_gelu_forward: the MLP's up-projection and its GELU, pre = inp @ weight^T + bias, out = gelu(pre).

Call path: ``op(inp, weight, bias, version=N) -> (pre, out)`` with inp (B, T, C) or (N, C), weight
(OC, C), bias (OC,) or None. Both outputs have inp's leading dimensions and OC columns: GPT-2's
``fch`` (the backward's gelu_backward reads it) and ``fch_gelu`` (the next matmul's input).

The kernels live in matmul_forward.cu: version 2 is matmul_forward version 5's GEMM with a
bias + GELU epilogue; version 1 is the same GEMM followed by gelu_forward version 1, the unfused
pair the fusion is measured against.
"""

from __future__ import annotations

import numpy as np

from ._op import Bound, Op, Version, kernel_of, kernels_only
from . import matmul_forward as _mm
from . import gelu_forward as _gelu

SOURCE = "matmul_forward.cu"


def reference(inp, weight, bias):
    pre = _mm.reference(inp, weight, bias)["out"]
    return {"pre": pre, "out": _gelu.reference(pre)["out"]}


def allocate(xp, a):
    shape = a["inp"].shape[:-1] + (a["weight"].shape[0],)
    return {"pre": xp.empty(shape, dtype=np.float32), "out": xp.empty(shape, dtype=np.float32)}


def _args(a):
    bt, c, oc = _mm._dims(a)
    grid = ((oc + 127) // 128, (bt + 127) // 128)
    return bt, c, oc, grid


@kernels_only
def _launch_v1(a, s):
    bt, c, oc, grid = _args(a)
    kernel_of("matmul_forward", "matmul_forward_kernel5")(grid, (256,), (a["pre"], a["inp"], a["weight"], a["bias"],
                                                                         np.int32(bt), np.int32(c), np.int32(oc)))
    n = bt * oc
    kernel_of("gelu_forward", "gelu_forward_kernel1")(((n + 255) // 256,), (256,), (a["out"], a["pre"], np.int32(n)))


@kernels_only
def _launch_v2(a, s):
    bt, c, oc, grid = _args(a)
    kernel_of("matmul_gelu_forward", "matmul_gelu_forward_kernel2")(
        grid, (256,), (a["pre"], a["out"], a["inp"], a["weight"], a["bias"], np.int32(bt), np.int32(c), np.int32(oc)))


def _baseline(a):
    # cuBLAS for the GEMM (the FLOPs); the GELU is elementwise and memory-bound next to it
    return _mm._baseline(a)


OP = Op(
    name="matmul_gelu_forward",
    summary="MLP up-projection with GELU: pre = inp @ weight^T + bias, out = gelu(pre)",
    source=SOURCE,
    inputs=("inp", "weight", "bias"),
    input_defaults={"bias": None},   # op(inp, weight): no bias
    outputs=("pre", "out"),
    versions={
        1: Version(1, "unfused: matmul_forward v5, then gelu_forward v1 (two launches)", _launch_v1,
                   block_sizes=(256,), default_block_size=256),
        2: Version(2, "fused: matmul_forward v5's GEMM with bias + GELU in the epilogue, writing pre and out "
                      "(one launch)", _launch_v2, block_sizes=(256,), default_block_size=256),
    },
    default_version=2,
    default_note=("an op of llmcupy's own, past llm.c's ladder: 2 is the fusion; 1, the unfused pair, is what "
                  "it is measured against"),
    reference_fn=reference,
    make_inputs_fn=_mm.make_inputs,
    allocate_fn=allocate,
    validate_fn=lambda a: _mm.validate(a),
    sizes={"B": 8, "T": 1024, "C": 768, "OC": 3072},
    sim_sizes={"B": 1, "T": 128, "C": 64, "OC": 256},
    test_shapes=[
        {"B": 1, "T": 1, "C": 7, "OC": 5},                    # one row, nothing a power of two
        {"B": 1, "T": 130, "C": 37, "OC": 133},                # past every tile, C % 4 != 0 (scalar slabs)
        {"B": 2, "T": 64, "C": 48, "OC": 256},                 # whole column tiles, float4 everywhere
        {"B": 3, "T": 47, "C": 52, "OC": 260, "has_bias": 0},  # no bias, partial tiles both ways
    ],
    tolerance={"pre": (1e-3, float(np.finfo(np.float32).eps)), "out": (1e-3, float(np.finfo(np.float32).eps))},
    tolerance_note=(
        "pre is matmul_forward's output and takes its tolerance (FP32 accumulation over C of products in [-1, 1]: "
        "~C * eps * |partial sums|, 8e-4 at C = 768). out = gelu(pre) with |gelu'(x)| <= 1.13, so pre's error "
        "passes through at most ~1.13x, plus ~1e-6 of tanh (computed from the exponential, not tanhf); 1e-3 absolute covers it at the test sizes "
        "(C <= 64 here: errors ~1e-5)."
    ),
    sizes_of=lambda a: {"BT": _mm._dims(a)[0], "C": _mm._dims(a)[1], "OC": _mm._dims(a)[2]},
    bound=Bound("flops", flops=lambda s: 2 * s["BT"] * s["C"] * s["OC"], baseline=_baseline),
    notes="Versions run 256 threads; any shape. GPT-2 uses it for the MLP's up-projection (OC = 4C).",
)
