"""matmul_backward: gradients of the dense layer out = inp @ weight^T + bias.

Call path (llm.c's argument order): ``op(dinp, dweight, dbias, dout, inp, weight, version=1)`` returns
``(dinp, dweight, dbias)``, the same arrays updated in place: ``dinp += dout @ weight``,
``dweight += dout^T @ inp`` (beta = 1, as in llm.c's dev file) and ``dbias = column sums of dout``
(overwritten). ``dbias`` may be None (GPT-2's LM head has no bias); it is then skipped.

``overwrite_dinp=True`` gives the FP32 trainer's ``dinp = dout @ weight`` (beta = 0): dinp's old
contents are never read, so the trainer need not zero it before every call (49 memsets, ~1 GB of
writes per 124M step at B=4, T=1024).
"""

from __future__ import annotations

import numpy as np

from ..runtime import backend as _backend
from ..runtime import blas
from ._op import Bound, Op, Version, check_float32, kernel_of, need, scratch

SOURCE = "matmul_backward.cu"


def reference(dinp, dweight, dbias, dout, inp, weight, overwrite_dinp=False):
    # llm.c's CPU reference adds into dinp and dweight and writes dbias (summed in double); the
    # products are accumulated in double here so the reference is the exact result
    c, oc = inp.shape[-1], weight.shape[0]
    g = dout.reshape(-1, oc).astype(np.float64)
    x = inp.reshape(-1, c).astype(np.float64)
    dinp_before = 0.0 if overwrite_dinp else dinp.astype(np.float64)
    out = {
        "dinp": (dinp_before + (g @ weight.astype(np.float64)).reshape(dinp.shape)).astype(np.float32),
        "dweight": (dweight.astype(np.float64) + g.T @ x).astype(np.float32),
        "dbias": None if dbias is None else g.sum(axis=0).astype(np.float32),
    }
    return out


def make_inputs(rng, B, T, C, OC, has_bias=1, overwrite_dinp=0):
    # the harness: dout, inp, weight uniform in [-1, 1]. It starts the gradients at zero; here dinp
    # and dweight start uniform in [-1, 1] so that the accumulation (beta = 1) is checked, and dbias
    # starts with values the kernel must overwrite. With overwrite_dinp, dinp starts as NaN: a
    # version that read it (beta = 0 done as 0 * dinp + product) would fail the check.
    u = lambda *shape: rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)  # noqa: E731
    dinp = u(B, T, C)
    if overwrite_dinp:
        dinp[...] = np.nan
    return {
        "dinp": dinp,
        "dweight": u(OC, C),
        "dbias": u(OC) if has_bias else None,
        "dout": u(B, T, OC),
        "inp": u(B, T, C),
        "weight": u(OC, C),
        "overwrite_dinp": bool(overwrite_dinp),
    }


def validate(a):
    check_float32("matmul_backward", **{k: a[k] for k in ("dinp", "dweight", "dbias", "dout", "inp", "weight")})
    inp, weight, dout = a["inp"], a["weight"], a["dout"]
    need(inp.ndim >= 2, f"matmul_backward: inp must be (B, T, C) or (N, C), got shape {inp.shape}")
    need(weight.ndim == 2, f"matmul_backward: weight must be 2-D (OC, C), got shape {weight.shape}")
    oc, c = weight.shape
    need(inp.shape[-1] == c, f"matmul_backward: inp {inp.shape} must have C = {c} columns like weight {weight.shape}")
    need(dout.shape == inp.shape[:-1] + (oc,),
         f"matmul_backward: dout must have shape {inp.shape[:-1] + (oc,)} (inp's rows, OC), got {dout.shape}")
    need(a["dinp"].shape == inp.shape, f"matmul_backward: dinp must have inp's shape {inp.shape}, got {a['dinp'].shape}")
    need(a["dinp"].flags.c_contiguous, "matmul_backward: dinp must be C-contiguous (it is updated in place)")
    need(a["dweight"].shape == weight.shape,
         f"matmul_backward: dweight must have weight's shape {weight.shape}, got {a['dweight'].shape}")
    if a["dbias"] is not None:
        need(a["dbias"].shape == (oc,), f"matmul_backward: dbias must have shape ({oc},), got {a['dbias'].shape}")
    need(isinstance(a["overwrite_dinp"], (bool, np.bool_)),
         f"matmul_backward: overwrite_dinp must be True or False, got {a['overwrite_dinp']!r}")


def allocate(xp, a):
    # every gradient is updated in place
    return {"dinp": a["dinp"], "dweight": a["dweight"], "dbias": a["dbias"]}


def _dims(a):
    oc, c = a["weight"].shape
    return a["inp"].size // c, c, oc


def _launch_v1(a, bs):
    bt, c, oc = _dims(a)
    dout2d = a["dout"].reshape(bt, oc)
    # cuBLAS SGEMMs with beta = 1 accumulate straight into the gradients: no scratch product and no
    # add kernel (the LM head's dinp product alone was a 154 MB scratch at B=4, T=1024); beta = 0
    # overwrites dinp without reading it
    dinp_beta = 0.0 if a["overwrite_dinp"] else 1.0
    blas.gemm(dout2d, a["weight"], a["dinp"].reshape(bt, c), beta=dinp_beta)         # dinp (+)= dout @ W
    blas.gemm(dout2d, a["inp"].reshape(bt, c), a["dweight"], trans_a=True, beta=1.0)  # dW += dout^T @ inp
    _bias_gradient(a, bs)


def _bias_gradient(a, bs):
    """dbias = column sums of dout (both versions: one block per column), unless dbias is None."""
    if a["dbias"] is None:
        return
    bt, _, oc = _dims(a)
    kernel_of("matmul_backward", "matmul_backward_bias_kernel1")(
        (oc,), (bs,), (a["dbias"], a["dout"], np.int32(bt), np.int32(oc)), shared_mem=4 * bs)


def _tiles(m, n):
    """The grid of matmul_forward 5's tiling for an (m, n) output: a 256-thread block per 128x128 tile,
    blockIdx.x along n."""
    return ((n + 127) // 128, (m + 127) // 128), (256,)


def _launch_v2(a, bs):
    # both GEMMs on matmul_forward v5's kernel (accumulating epilogue); it wants K-contiguous
    # operands (out = A @ B^T), so the K-major ones are copied transposed into scratch first.
    # Overwriting dinp is version 5 itself (its plain epilogue, no bias).
    bt, c, oc = _dims(a)
    dout2d = a["dout"].reshape(bt, oc)
    inp2d = a["inp"].reshape(bt, c)
    gemm = kernel_of("matmul_forward", "matmul_backward_gemm_kernel2")
    w_t = scratch("matmul_backward", "weight_t", (c, oc))
    w_t[...] = a["weight"].T
    if a["overwrite_dinp"]:
        kernel_of("matmul_forward", "matmul_forward_kernel5")(
            *_tiles(bt, c), (a["dinp"], dout2d, w_t, None, np.int32(bt), np.int32(oc), np.int32(c)))
    else:
        gemm(*_tiles(bt, c), (a["dinp"], dout2d, w_t, np.int32(bt), np.int32(oc), np.int32(c)))
    dout_t = scratch("matmul_backward", "dout_t", (oc, bt))
    dout_t[...] = dout2d.T
    inp_t = scratch("matmul_backward", "inp_t", (c, bt))
    inp_t[...] = inp2d.T
    gemm(*_tiles(oc, c), (a["dweight"], dout_t, inp_t, np.int32(oc), np.int32(bt), np.int32(c)))
    _bias_gradient(a, bs)


def _power_of_two(a, bs):
    return None if bs & (bs - 1) == 0 else f"block size {bs} must be a power of two (tree reduction)"


def _baseline(a):
    # cuBLAS on the same shapes: the two GEMMs, which carry all but BT*OC of the FLOPs
    xp = _backend.xp()
    bt, c, oc = _dims(a)
    dout2d = a["dout"].reshape(bt, oc)
    dinp, dweight = xp.empty((bt, c), np.float32), xp.empty((oc, c), np.float32)
    blas.gemm(dout2d, a["weight"], dinp)
    blas.gemm(dout2d, a["inp"].reshape(bt, c), dweight, trans_a=True)
    return dinp, dweight


_TOL = (1e-3, float(np.finfo(np.float32).eps))

OP = Op(
    name="matmul_backward",
    summary="dense layer backward: dinp += dout @ W (= with overwrite_dinp), dW += dout^T @ inp, dbias = colsum(dout)",
    source=SOURCE,
    inputs=("dinp", "dweight", "dbias", "dout", "inp", "weight", "overwrite_dinp"),
    input_defaults={"overwrite_dinp": False},
    optional_inputs=("dbias",),      # None: no bias gradient
    outputs=("dinp", "dweight", "dbias"),
    versions={
        1: Version(1, "two cuBLAS SGEMMs (runtime.blas, beta = 1) + bias: block per channel, double sums, tree",
                   _launch_v1, block_sizes=(512,), default_block_size=512, requires=_power_of_two),
        2: Version(2, "both GEMMs on matmul_forward v5's warp-tiled kernel with an accumulating epilogue "
                      "(transposed copies of the K-major operands) + version 1's bias kernel",
                   _launch_v2, block_sizes=(512,), default_block_size=512, requires=_power_of_two),
    },
    default_version=1,
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=validate,
    sizes={"B": 8, "T": 1024, "C": 768, "OC": 3072},
    sim_sizes={"B": 2, "T": 16, "C": 48, "OC": 96},
    test_shapes=[
        {"B": 1, "T": 1, "C": 7, "OC": 5},       # a single row, nothing a power of two
        {"B": 2, "T": 37, "C": 24, "OC": 40},    # rows not a multiple of anything
        {"B": 3, "T": 200, "C": 33, "OC": 12},   # B*T = 600 > 512: threads sum several rows
        {"B": 1, "T": 130, "C": 136, "OC": 132, "has_bias": 0},  # v2: past 128-tiles in all three dims
        {"B": 2, "T": 37, "C": 24, "OC": 40, "overwrite_dinp": 1},                # the trainer's beta = 0
        {"B": 1, "T": 130, "C": 136, "OC": 132, "overwrite_dinp": 1},              # ... on v2's tiles
    ],
    tolerance={"dinp": _TOL, "dweight": _TOL, "dbias": _TOL},
    tolerance_note=(
        "llm.c's tolerance with TF32 off (exact FP32 SGEMMs; TF32 only inside blas.tf32(True)), against "
        "a float64 reference: 1e-3 absolute plus one FP32 epsilon relative. At the spec's sizes dinp is a "
        "length-3072 and dweight a length-8192 sum of products uniform in [-1, 1]; FP32 rounding grows like "
        "sqrt(n) * eps/2 * n/4 (1e-4 and 4e-4), inside 1e-3. dbias is summed in double per thread and "
        "folded in FP32: ~1e-5."
    ),
    tf32_tolerance={"dinp": (1e-1, 2.0 ** -10), "dweight": (1e-1, 2.0 ** -10)},
    tf32_tolerance_note=(
        "Under blas.tf32(True) (the trainer's default, and bench --trainer-shapes) version 1's two GEMMs run "
        "on TF32 tensor cores (10 mantissa bits per input). At the trainer's shapes dinp sums OC = 3072 and "
        "dweight B*T = 4096 products of values in [-1, 1]: a NumPy emulation (786k outputs each) gives largest "
        "errors of 2.2e-2 and 2.7e-2 with inputs rounded to nearest, 6.3e-2 and 6.6e-2 truncated (about 5 "
        "standard deviations), so llm.c's 1e-1 for TF32 plus TF32's 2^-10 relative. dbias is a kernel's FP32 "
        "sum and keeps its tolerance, as version 2 (FP32 SIMT GEMMs) keeps all of them."
    ),
    sizes_of=lambda a: {**dict(zip(("BT", "C", "OC"), _dims(a))), "bias": int(a["dbias"] is not None)},
    bound=Bound("flops", flops=lambda s: 4 * s["BT"] * s["C"] * s["OC"] + s["bias"] * s["BT"] * s["OC"],
                baseline=_baseline),
    notes=("dinp and dweight accumulate (beta = 1) and dbias is overwritten, as in llm.c's dev file; the FP32 "
           "trainer overwrites dinp (overwrite_dinp=True: beta = 0, dinp is not read) and accumulates dbias "
           "with matmul_backward_bias version 4; llmcupy's model does the same with dbias=None (skipped here) "
           "and the matmul_backward_bias op, any version of it."),
)
