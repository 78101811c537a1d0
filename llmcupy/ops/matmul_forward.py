"""matmul_forward: the dense layer out = inp @ weight^T + bias (bias optional: the LM head has none).

Call path: ``op(inp, weight, bias, version=N)`` with inp (B, T, C) or (N, C), weight (OC, C) and
bias (OC,) or None (left out, it is None); returns out with inp's leading dimensions and OC columns.

Block sizes are llm.c's "sqrt block sizes": a block size s here means an s x s block (s*s threads).
Versions 1 and 2 sweep s in {4, 8, 16, 32} (16 to 1024 threads); version 4 always runs 16 x 16;
version 5 always runs 256 threads (a 1-D block: its tiling is fixed by the kernel).
"""

from __future__ import annotations

import numpy as np

from ..runtime import backend as _backend
from ..runtime import blas
from ._op import Bound, Op, Version, check_float32, kernel_of, kernels_only, misaligned, need

SOURCE = "matmul_forward.cu"
SQRT_BLOCK_SIZES = (4, 8, 16, 32)


def reference(inp, weight, bias):
    # llm.c's CPU triple loop, accumulated in double here so the reference is the exact product
    c = inp.shape[-1]
    x = inp.reshape(-1, c).astype(np.float64)
    out = x @ weight.astype(np.float64).T
    if bias is not None:
        out += bias.astype(np.float64)
    return {"out": out.astype(np.float32).reshape(inp.shape[:-1] + (weight.shape[0],))}


def make_inputs(rng, B, T, C, OC, has_bias=1):
    # the harness: inp, weight and bias uniform in [-1, 1]
    inp = rng.uniform(-1.0, 1.0, size=(B, T, C)).astype(np.float32)
    weight = rng.uniform(-1.0, 1.0, size=(OC, C)).astype(np.float32)
    bias = rng.uniform(-1.0, 1.0, size=(OC,)).astype(np.float32) if has_bias else None
    return {"inp": inp, "weight": weight, "bias": bias}


def validate(a):
    inp, weight, bias = a["inp"], a["weight"], a["bias"]
    check_float32("matmul_forward", inp=inp, weight=weight, bias=bias)
    need(inp.ndim >= 2, f"matmul_forward: inp must be (B, T, C) or (N, C), got shape {inp.shape}")
    need(weight.ndim == 2, f"matmul_forward: weight must be 2-D (OC, C), got shape {weight.shape}")
    need(weight.shape[1] == inp.shape[-1],
         f"matmul_forward: weight {weight.shape} must have C = {inp.shape[-1]} columns (inp is {inp.shape})")
    if bias is not None:
        need(bias.shape == (weight.shape[0],),
             f"matmul_forward: bias must have shape ({weight.shape[0]},) (OC), got {bias.shape}")


def allocate(xp, a):
    return {"out": xp.empty(a["inp"].shape[:-1] + (a["weight"].shape[0],), dtype=np.float32)}


def _dims(a):
    c = a["inp"].shape[-1]
    bt = a["inp"].size // c if c else 0
    return bt, c, a["weight"].shape[0]


def _kernel(name):
    return kernel_of("matmul_forward", name)


@kernels_only
def _launch_v1(a, s):
    bt, c, oc = _dims(a)
    _kernel("matmul_forward_kernel1")(((bt + s - 1) // s, (oc + s - 1) // s), (s, s),
                                      (a["out"], a["inp"], a["weight"], a["bias"],
                                       np.int32(bt), np.int32(c), np.int32(oc)))


def _launch_v2(a, s):
    bt, c, oc = _dims(a)
    out2d = a["out"].reshape(bt, oc)
    # cuBLAS SGEMM (TF32 only inside blas.tf32(True)); the same call through NumPy in the emulator
    blas.gemm(a["inp"].reshape(bt, c), a["weight"], out2d, trans_b=True)
    if a["bias"] is not None:
        threads = s * s
        _kernel("matmul_forward_bias_kernel2")(((bt * oc + threads - 1) // threads,), (threads,),
                                               (a["out"], a["bias"], np.int32(bt), np.int32(oc)))


def _launch_v3(a, s):
    bt, c, oc = _dims(a)
    # cuBLASLt: the bias is added in the GEMM's epilogue, no second pass over out (plain GEMM without bias)
    blas.gemm(a["inp"].reshape(bt, c), a["weight"], a["out"].reshape(bt, oc), trans_b=True, bias=a["bias"])


@kernels_only
def _launch_v4(a, s):
    bt, c, oc = _dims(a)
    _kernel("matmul_forward_kernel4")((bt // 128, oc // 128), (16, 16),
                                      (a["out"], a["inp"], a["weight"], a["bias"], np.int32(c), np.int32(oc)))


@kernels_only
def _launch_v5(a, s):
    bt, c, oc = _dims(a)
    _kernel("matmul_forward_kernel5")(((oc + 127) // 128, (bt + 127) // 128), (256,),
                                      (a["out"], a["inp"], a["weight"], a["bias"],
                                       np.int32(bt), np.int32(c), np.int32(oc)))


def _requires_v3(a, s):
    # cuBLASLt's bias epilogue needs a 16-byte aligned bias (blas.gemm refuses another)
    return misaligned(a, ("bias",), align=blas.BIAS_ALIGN, use="cuBLASLt's bias epilogue")


def _requires_v4(a, s):
    bt, c, oc = _dims(a)
    problems = []
    if bt % 128:
        problems.append(f"B*T = {bt} must be a multiple of 128")
    if oc % 128:
        problems.append(f"OC = {oc} must be a multiple of 128")
    if c % 32:
        problems.append(f"C = {c} must be a multiple of 32")
    if alignment := misaligned(a, ("inp", "weight", "bias"), use="float4 loads"):
        problems.append(alignment)
    if problems:
        return ("the 128 x 128 tile kernel has no bounds checks: " + "; ".join(problems)
                + " (use version 1 or 2 for other shapes)")
    return None


def _baseline(a):
    # cuBLAS on the same shapes: the GEMM alone, which dominates the FLOPs
    bt, c, oc = _dims(a)
    out = _backend.xp().empty((bt, oc), dtype=np.float32)
    blas.gemm(a["inp"].reshape(bt, c), a["weight"], out, trans_b=True)
    return out


OP = Op(
    name="matmul_forward",
    summary="dense layer out = inp @ weight^T + bias (bias optional)",
    source=SOURCE,
    inputs=("inp", "weight", "bias"),
    input_defaults={"bias": None},   # op(inp, weight): no bias
    outputs=("out",),
    versions={
        1: Version(1, "naive: one thread per output, s x s blocks, dot product from global memory",
                   _launch_v1, block_sizes=SQRT_BLOCK_SIZES, default_block_size=16),
        2: Version(2, "cuBLAS SGEMM (runtime.blas) + a grid-stride bias kernel of s*s threads",
                   _launch_v2, block_sizes=SQRT_BLOCK_SIZES, default_block_size=16),
        3: Version(3, "cuBLASLt with the bias fused in the epilogue (runtime.blas)",
                   _launch_v3, block_sizes=(16,), default_block_size=16, requires=_requires_v3),
        4: Version(4, "128x128 tiles, 8x8 outputs per thread, float4 loads via shared memory (16x16 threads)",
                   _launch_v4, block_sizes=(16,), default_block_size=16, requires=_requires_v4),
        5: Version(5, "warp-tiled SIMT SGEMM: 128x128 block / 64x32 warp / 8x8 thread tiles, double-buffered "
                      "cp.async (sm_80+) slabs, bias epilogue, any shape (256 threads)",
                   _launch_v5, block_sizes=(256,), default_block_size=256),
    },
    default_version=2,
    default_note="not llm.c's choices (its FP32 trainer runs the hand-written 4, its file calls cuBLASLt's 3 "
                 "fastest): the trainer runs its forward GEMMs on cuBLAS like every other GEMM, and 4 refuses "
                 "B*T or OC not a multiple of 128 (the emulator's trainer sizes); which is fastest on a GPU is "
                 "measured (bench --trainer-shapes)",
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=validate,
    sizes={"B": 32, "T": 1024, "C": 768, "OC": 3072},
    sim_sizes={"B": 1, "T": 128, "C": 64, "OC": 128},
    test_shapes=[
        {"B": 1, "T": 1, "C": 7, "OC": 5},                     # one row, nothing a power of two
        {"B": 2, "T": 5, "C": 24, "OC": 37, "has_bias": 0},     # no bias (the LM head's case)
        {"B": 1, "T": 128, "C": 96, "OC": 128},                 # one 128x128 tile, three C-chunks
        {"B": 2, "T": 128, "C": 64, "OC": 256, "has_bias": 0},  # 2x2 tiles, two C-chunks, no bias
        {"B": 1, "T": 130, "C": 37, "OC": 133},                 # past every tile (128 rows/cols, 16-wide slab), C % 4 != 0
        {"B": 3, "T": 47, "C": 52, "OC": 260, "has_bias": 0},   # float4 slabs with a partial last slab, OC % 128 != 0
    ],
    tolerance={"out": (1e-3, float(np.finfo(np.float32).eps))},
    tolerance_note=(
        "Exact FP32 math (cuBLAS uses TF32 only inside blas.tf32(True); versions 1 and 4 are FP32 FMA chains), "
        "against a float64 reference. Each output is a length-C dot product of values uniform in [-1, 1] "
        "(|products| <= 1, sum of |products| ~ C/4): the error of an FP32 accumulation grows like "
        "C * eps * |partial sums|, about 768 * 1.2e-7 * 9 = 8e-4 at the spec's C = 768 (partial sums "
        "~ sqrt(C/9) ~ 9; the random-walk estimate sqrt(C) * eps/2 * C/4 is 3e-4), so 1e-3 absolute plus "
        "one FP32 epsilon relative. llm.c's 1e-1 is only needed for TF32 (10-bit mantissa) tensor cores."
    ),
    tf32_tolerance={"out": (1e-1, 2.0 ** -10)},
    tf32_tolerance_note=(
        "Under blas.tf32(True) (the trainer's default, and bench --trainer-shapes) versions 2 and 3 run cuBLAS "
        "on TF32 tensor cores, which keep 10 mantissa bits of each input: a product errs by ~2^-10 relative "
        "and a length-C sum by a random walk growing like sqrt(C). A NumPy emulation at the trainer's shapes "
        "(C = 768, inputs uniform in [-1, 1], 786k outputs) gives a largest error of 1.2e-2 with inputs "
        "rounded to nearest and 3.2e-2 truncated (one standard deviation 2.4e-3 and 6.3e-3), so llm.c's 1e-1 "
        "for its TF32 paths, plus TF32's 2^-10 relative for the bias-sized outputs. Versions 1, 4 and 5 "
        "compute in FP32 whatever the setting and keep the FP32 tolerance (the harness applies this one only "
        "to a run that called cuBLAS)."
    ),
    sizes_of=lambda a: {"BT": _dims(a)[0], "C": _dims(a)[1], "OC": _dims(a)[2]},
    bound=Bound("flops", flops=lambda s: 2 * s["BT"] * s["C"] * s["OC"], baseline=_baseline),
    notes=("Block size s means an s x s thread block (llm.c's 'sqrt block size'). Version 4 (the FP32 "
           "trainer's kernel) needs B*T % 128 == 0, OC % 128 == 0 and C % 32 == 0; it accepts bias=None."),
)
