"""trimat_forward: causal attention scores (the lower triangle of scale * Q K^T) from packed QKV.

Call: ``out = op(inp, NH)``; NH is a plain Python int.
Input ``inp`` (B, T, 3C) float32 = (B, T, 3, NH, HS). Output ``out`` (B, NH, T, T) float32 with
out[b, h, t, t2] = <q[b,h,t], k[b,h,t2]> / sqrt(HS) for t2 <= t; entries above the diagonal are
unspecified (version 0 computes them, versions 1-4 leave most untouched). The reference puts NaN
there, and non-finite reference entries are not compared.
"""

from __future__ import annotations

import math

import numpy as np

from ..runtime import blas
from ..runtime import xp as _xp
from ._attention import causal_flops, check_packed_qkv, packed_qkv, split_qkv
from ._op import Bound, Op, Version, kernel_of, kernels_only
from .attention_permute import launch_permute

SOURCE = "trimat_forward.cu"
TILE = 128
THREADS = (16, 16)


def reference(inp, NH):
    NH = int(NH)
    B, T, C3 = inp.shape
    HS = C3 // 3 // NH
    q, k, _ = split_qkv(inp.astype(np.float64), NH)
    out = (q @ k.swapaxes(-1, -2)) * (1.0 / math.sqrt(HS))
    out[..., np.triu(np.ones((T, T), dtype=bool), 1)] = np.nan  # "don't care": not compared
    return {"out": out.astype(np.float32)}


def make_inputs(rng, B, T, C, NH):
    return {"inp": packed_qkv(rng, B, T, C), "NH": int(NH)}


def _dims(a):
    return check_packed_qkv("trimat_forward", a["inp"], a["NH"])


def validate(a):
    _dims(a)


def allocate(xp, a):
    B, T, C, NH = _dims(a)
    return {"out": xp.empty((B, NH, T, T), dtype=np.float32)}


def _launch_v0(a, bs):
    xp = _xp()
    B, T, C, NH = _dims(a)
    HS = C // NH
    qkvr = xp.empty((3, B, NH, T, HS), dtype=np.float32)
    launch_permute(qkvr, a["inp"], NH, bs)
    q, k = qkvr[0], qkvr[1]
    # the full T x T, the scale as cuBLAS's alpha, K read transposed in place
    blas.gemm(q, k, a["out"], trans_b=True, alpha=1.0 / math.sqrt(HS))


def _custom(number):
    @kernels_only
    def launch(a, bs):
        B, T, C, NH = _dims(a)
        grid = (T // TILE, T // TILE, B * NH)
        kernel_of("trimat_forward", f"trimat_forward_kernel{number}")(
            grid, THREADS,
            (a["out"], a["inp"], np.int32(T), np.int32(C), np.int32(NH), np.float32(1.0 / math.sqrt(C // NH))))

    return launch


def _requires(hs_multiple):
    def requires(a, bs):
        _, T, C, NH = _dims(a)
        if T % TILE:
            return f"T = {T} must be a multiple of {TILE} (128x128 output tiles per block)"
        if (C // NH) % hs_multiple:
            return f"head size {C // NH} must be a multiple of {hs_multiple}"
        return None

    return requires


def _sizes_of(a):
    B, T, C, NH = _dims(a)
    return {"B": B, "T": T, "C": C, "NH": NH}


def _flops(s):
    # the useful (causal) half: Q K^T
    return causal_flops(s, 1)


def _baseline(a):
    """cuBLAS on the full T x T: q, k made contiguous (B, NH, T, HS), one batched matmul, scaled."""
    xp = _xp()
    B, T, C, NH = _dims(a)
    HS = C // NH
    x = a["inp"].reshape(B, T, 3, NH, HS)
    q = xp.ascontiguousarray(x[:, :, 0].transpose(0, 2, 1, 3))
    k = xp.ascontiguousarray(x[:, :, 1].transpose(0, 2, 1, 3))
    return xp.matmul(q, k.swapaxes(-1, -2)) * np.float32(1.0 / math.sqrt(HS))


OP = Op(
    name="trimat_forward",
    summary="causal attention scores scale * Q K^T (lower triangle) from packed QKV (B, T, 3C)",
    source=SOURCE,
    inputs=("inp", "NH"),
    outputs=("out",),
    versions={
        0: Version(0, "cuBLAS baseline: permute, then one strided-batched matmul over the full T x T",
                   _launch_v0, block_sizes=(256,)),
        1: Version(1, "naive: 8x8 outputs per thread, one HS-long dot product each", _custom(1),
                   block_sizes=(256,), requires=_requires(1)),
        2: Version(2, "8x8 register blocking: one sweep over HS, outer products in registers", _custom(2),
                   block_sizes=(256,), requires=_requires(1)),
        3: Version(3, "register blocking with float4 loads along HS and float4 stores", _custom(3),
                   block_sizes=(256,), requires=_requires(4)),
        4: Version(4, "128x32 Q/K slices in shared memory (coalesced), rotated dim index, float4 stores",
                   _custom(4), block_sizes=(256,), requires=_requires(32)),
    },
    default_version=4,
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=validate,
    sizes={"B": 8, "T": 1024, "C": 768, "NH": 12},
    sim_sizes={"B": 1, "T": 128, "C": 64, "NH": 2},
    test_shapes=[{"B": 1, "T": 1, "C": 6, "NH": 2}, {"B": 1, "T": 128, "C": 64, "NH": 2},
                 {"B": 2, "T": 256, "C": 96, "NH": 3}, {"B": 1, "T": 128, "C": 24, "NH": 2},
                 {"B": 3, "T": 5, "C": 10, "NH": 1}],
    tolerance={"out": (1e-4, float(np.finfo(np.float32).eps))},
    tolerance_note=(
        "llm.c's 1e-4 + FLT_EPSILON*|ref|: an FP32 sum of HS products of values in [-1, 1] is off by at most "
        "~HS * 6e-8 * sum|q*k| (~1e-5 before the 1/sqrt(HS) scale at HS = 64, typically far less). Version 0 runs "
        "cuBLAS in full FP32 (CuPy's default, CUPY_TF32 unset); under TF32 its error can exceed 1e-4. Entries "
        "above the diagonal are NaN in the reference and not compared."
    ),
    sizes_of=_sizes_of,
    bound=Bound("flops", flops=_flops, baseline=_baseline),
    notes="Only t2 <= t is meaningful; versions 1-4 need T % 128 == 0, 3 needs HS % 4 == 0, 4 needs HS % 32 == 0.",
)
