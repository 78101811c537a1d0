"""attention_forward: causal multi-head self-attention, forward (FP32).

Call: ``out, att, qkvr = op(inp, NH)``; NH is a plain Python int (not an array).

Inputs
  ``inp``  (B, T, 3C) float32, the QKV projection = (B, T, 3, NH, HS) with HS = C / NH: for
           position (b, t), floats [0, C) are the query, [C, 2C) the key, [2C, 3C) the value, and
           head h owns [h*HS, (h+1)*HS) inside each third.
  ``NH``   number of heads (int); C % NH == 0.

Outputs (every version produces all three, identically laid out, so any forward version can be
followed by attention_backward)
  ``out``  (B, T, C) float32: out[b, t, h*HS + d] = sum_{t2 <= t} att[b, h, t, t2] * v[b, h, t2, d].
  ``att``  (B, NH, T, T) float32: att[b, h, t, t2] = softmax over t2 <= t of scale * <q[b,h,t], k[b,h,t2]>,
           scale = 1/sqrt(HS); row t is the query, column t2 the key. EXACTLY 0.0 above the
           diagonal (t2 > t) in every version, so a dense GEMM may read it (dV = att^T dY).
  ``qkvr`` (3, B, NH, T, HS) float32: qkvr[0] = q, qkvr[1] = k, qkvr[2] = v with
           q[b, h, t, d] = inp[b, t, h*HS + d], k[...] = inp[b, t, C + h*HS + d],
           v[...] = inp[b, t, 2C + h*HS + d] (exact copies). Flattened it is llm.c's qkvr buffer:
           q, k, v blocks of B*T*C floats at offsets 0, B*T*C, 2*B*T*C.

Scratch (not an output): ``preatt`` (B, NH, T, T), the pre-softmax scores. Its meaning differs by
version, which is why it is not part of the output contract: versions 1 and 3 hold the SCALED
scores with -inf above the diagonal (llm.c's CPU reference), version 4 (the trainer's) holds the
UNSCALED Q K^T over the full T x T (the scale lives in the softmax), version 2 has none. A launcher
reuses ``arrays["preatt"]`` when the caller passes one (the trainer reuses one buffer), else it
allocates it. tests/test_attention_forward.py checks each version's preatt convention.

Version-specific extras to meet the contract (documented in kernels_cu/attention_forward.cu):
version 1 also runs the attention permute kernel to fill qkvr (its own kernels read the packed
input); version 2 rebuilds att from the flash kernel's row statistics (m, l).
"""

from __future__ import annotations

import math

import numpy as np

from ..runtime import blas
from ..runtime import xp as _xp
from ._attention import causal_flops, check_packed_qkv, elementwise, int_index_problem, packed_qkv, split_qkv
from ._op import Bound, Op, Version, kernel_of, kernels_only, scratch
from .attention_permute import launch_permute
from .attention_unpermute import launch_unpermute

SOURCE = "attention_forward.cu"
SWEEP = (32, 64, 128, 256, 512)  # llm.c's sweep; it sizes permute/unpermute, the scale kernel and v1
SOFTMAX_THREADS = 256            # v3/v4 softmax, fixed as in llm.c
FLASH_TILE = 32                  # v2: Br = Bc = threads per block
HALF_REASON = ("needs BF16 activations (and cuDNN for 10), which this FP32 catalogue does not have yet; "
               "the FP32 versions 1-4 compute the same attention")


def reference(inp, NH):
    NH = int(NH)
    B, T, C3 = inp.shape
    C = C3 // 3
    HS = C // NH
    q, k, v = split_qkv(inp.astype(np.float64), NH)
    s = (q @ k.swapaxes(-1, -2)) * (1.0 / math.sqrt(HS))
    s = np.where(np.triu(np.ones((T, T), dtype=bool), 1), -np.inf, s)
    e = np.exp(s - s.max(axis=-1, keepdims=True))  # exp(-inf) = 0: an exact zero upper triangle
    att = e / e.sum(axis=-1, keepdims=True)
    out = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
    qkvr = np.stack(split_qkv(inp, NH))
    return {"out": out.astype(np.float32), "att": att.astype(np.float32),
            "qkvr": np.ascontiguousarray(qkvr, dtype=np.float32)}


def make_inputs(rng, B, T, C, NH):
    return {"inp": packed_qkv(rng, B, T, C), "NH": int(NH)}


def _dims(a):
    return check_packed_qkv("attention_forward", a["inp"], a["NH"])


def validate(a):
    _dims(a)


def allocate(xp, a):
    B, T, C, NH = _dims(a)
    return {"out": xp.empty((B, T, C), dtype=np.float32),
            "att": xp.empty((B, NH, T, T), dtype=np.float32),
            "qkvr": xp.empty((3, B, NH, T, C // NH), dtype=np.float32)}


def _kernel(name):
    return kernel_of("attention_forward", name)


def _preatt(a, B, NH, T):
    """The caller's preatt scratch when it passes one, else a fresh (B, NH, T, T) buffer."""
    buf = a.get("preatt")
    if buf is None:
        return scratch("attention_forward", "preatt", (B, NH, T, T))
    if tuple(buf.shape) != (B, NH, T, T) or buf.dtype != np.float32:
        from ._op import OpError

        raise OpError(f"attention_forward: preatt scratch must be float32 {(B, NH, T, T)}, got "
                      f"{buf.dtype} {tuple(buf.shape)}")
    return buf


@kernels_only
def _launch_v1(a, bs):
    B, T, C, NH = _dims(a)
    preatt = _preatt(a, B, NH, T)
    inp = a["inp"]
    ints = (np.int32(B), np.int32(T), np.int32(C), np.int32(NH))
    elementwise(_kernel("attention_query_key_kernel1"), B * NH * T * T, bs, (preatt, inp) + ints)
    elementwise(_kernel("attention_softmax_kernel1"), B * T * NH, bs,
                (a["att"], preatt, np.int32(B), np.int32(T), np.int32(NH)))
    elementwise(_kernel("attention_value_kernel1"), B * T * NH, bs, (a["out"], a["att"], inp) + ints)
    launch_permute(a["qkvr"], inp, NH, bs)  # not part of llm.c's v1: fills the qkvr output


@kernels_only
def _launch_v2(a, bs):
    B, T, C, NH = _dims(a)
    HS = C // NH
    qkvr = a["qkvr"]
    launch_permute(qkvr, a["inp"], NH, bs)
    o = scratch("attention_forward", "o", (B, NH, T, HS), fill=0.0)
    l = scratch("attention_forward", "l", (B, NH, T), fill=0.0)
    m = scratch("attention_forward", "m", (B, NH, T), fill=-np.inf)
    scale = np.float32(1.0 / math.sqrt(HS))
    smem = 4 * (3 * FLASH_TILE * HS + FLASH_TILE * FLASH_TILE)
    _kernel("attention_flash_kernel2")((B, NH), (FLASH_TILE,),
                                       (o, l, m, qkvr[0], qkvr[1], qkvr[2], np.int32(T), np.int32(HS), scale),
                                       shared_mem=smem)
    elementwise(_kernel("attention_att_from_stats_kernel2"), B * NH * T * T, bs,
                (a["att"], qkvr[0], qkvr[1], l, m, np.int32(B * NH), np.int32(T), np.int32(HS), scale))
    launch_unpermute(a["out"], o, bs)


def _gemm_attention(a, bs, softmax):
    """Versions 3 and 4: permute, preatt = Q K^T (cuBLAS), softmax(preatt) -> att, y = att V, unpermute."""
    B, T, C, NH = _dims(a)
    HS = C // NH
    qkvr = a["qkvr"]
    launch_permute(qkvr, a["inp"], NH, bs)
    q, k, v = qkvr[0], qkvr[1], qkvr[2]
    preatt = _preatt(a, B, NH, T)
    # strided-batched SGEMMs over the B*NH heads; K is read transposed in place (no K^T copy)
    blas.gemm(q, k, preatt, trans_b=True)  # unscaled Q K^T
    softmax(preatt, a["att"], B, T, NH, HS, bs)
    y = scratch("attention_forward", "y", (B, NH, T, HS))
    blas.gemm(a["att"], v, y)              # dense: reads att's zero upper triangle
    launch_unpermute(a["out"], y, bs)


def _softmax_v3(preatt, att, B, T, NH, HS, bs):
    elementwise(_kernel("attention_scale_kernel3"), B * NH * T * T, bs,
                (preatt, np.float32(1.0 / math.sqrt(HS)), np.int32(B), np.int32(NH), np.int32(T)))
    n = B * NH * T
    kernel_of("softmax_forward", "softmax_forward_kernel4")(
        (n,), (SOFTMAX_THREADS,), (att, preatt, np.int32(n), np.int32(T)),
        shared_mem=4 * 2 * (SOFTMAX_THREADS // 32))


def _softmax_v4(preatt, att, B, T, NH, HS, bs):
    n = B * NH * T
    grid = (32 * n + SOFTMAX_THREADS - 1) // SOFTMAX_THREADS
    _kernel("attention_softmax_kernel4")((grid,), (SOFTMAX_THREADS,),
                                         (att, preatt, np.float32(1.0 / math.sqrt(HS)), np.int32(n), np.int32(T)))


def _launch_v3(a, bs):
    _gemm_attention(a, bs, _softmax_v3)


def _launch_v4(a, bs):
    _gemm_attention(a, bs, _softmax_v4)


def _requires_v1(a, bs):
    B, T, _, NH = _dims(a)
    return int_index_problem(B, NH, T, 1)


def _requires_v2(a, bs):
    B, T, C, NH = _dims(a)
    too_many = int_index_problem(B, NH, T, 2)   # the kernel that rebuilds att from (m, l)
    if too_many:
        return too_many
    smem = 4 * (3 * FLASH_TILE * (C // NH) + FLASH_TILE * FLASH_TILE)
    if smem > 227 * 1024:
        return f"head size {C // NH} needs {smem} bytes of shared memory for the Q/K/V tiles, over 227 KiB"
    return None


def _requires_v3(a, bs):
    B, T, _, NH = _dims(a)
    return int_index_problem(B, NH, T, 3)   # the scale-and-mask kernel


def _requires_v4(a, bs):
    _, T, _, _ = _dims(a)
    return None if T % 4 == 0 else f"T = {T} must be a multiple of 4 (float4 rows of preatt)"


def _sizes_of(a):
    B, T, C, NH = _dims(a)
    return {"B": B, "T": T, "C": C, "NH": NH}


def _flops(s):
    # the causal half of both products: Q K^T and att V
    return causal_flops(s, 2)


def baseline_probabilities(a):
    """The causal softmax probabilities att (B, NH, T, T) and v (B, NH, T, HS) in plain xp calls on
    the arrays' device (cuBLAS Q K^T, xp elementwise/reductions): the first half of the baseline."""
    xp = _xp()
    B, T, C, NH = _dims(a)
    HS = C // NH
    x = a["inp"].reshape(B, T, 3, NH, HS)
    q, k, v = (xp.ascontiguousarray(x[:, :, i].transpose(0, 2, 1, 3)) for i in range(3))
    s = xp.matmul(q, k.swapaxes(-1, -2)) * np.float32(1.0 / math.sqrt(HS))
    s = xp.where(xp.triu(xp.ones((T, T), dtype=bool), 1), np.float32(-np.inf), s)
    e = xp.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True), v


def _baseline(a):
    """Attention in plain xp calls (cuBLAS GEMMs + CuPy elementwise/reductions), same outputs."""
    xp = _xp()
    B, T, C, _ = _dims(a)
    att, v = baseline_probabilities(a)
    return xp.matmul(att, v).transpose(0, 2, 1, 3).reshape(B, T, C)


OP = Op(
    name="attention_forward",
    summary="causal multi-head self-attention forward: (B, T, 3C), NH -> out (B, T, C), att, qkvr",
    source=SOURCE,
    inputs=("inp", "NH"),
    outputs=("out", "att", "qkvr"),
    versions={
        1: Version(1, "naive: scores / row softmax / values kernels on the packed input (+ permute for qkvr)",
                   _launch_v1, block_sizes=SWEEP, requires=_requires_v1),
        2: Version(2, "minimal FlashAttention-1 (32x32 tiles, m/l/O in global memory); att rebuilt from (m, l)",
                   _launch_v2, block_sizes=SWEEP, requires=_requires_v2),
        3: Version(3, "permute, cuBLAS Q K^T, scale+mask kernel, block-per-row softmax, cuBLAS att V, unpermute",
                   _launch_v3, block_sizes=SWEEP, requires=_requires_v3),
        4: Version(4, "permute, cuBLAS Q K^T, causal online warp softmax with the scale folded in, cuBLAS att V, "
                      "unpermute (the trainer's)", _launch_v4, block_sizes=SWEEP, requires=_requires_v4),
        5: Version(5, "16-bit version of 4 (BF16 as llm.c builds it)", unavailable=HALF_REASON),
        6: Version(6, "version 5 timed without permute/unpermute", unavailable=HALF_REASON),
        10: Version(10, "cuDNN flash attention (SDPA graph, BF16)", unavailable=HALF_REASON),
    },
    default_version=4,
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=validate,
    sizes={"B": 8, "T": 1024, "C": 768, "NH": 12},
    sim_sizes={"B": 1, "T": 32, "C": 64, "NH": 4},
    test_shapes=[{"B": 1, "T": 1, "C": 8, "NH": 2}, {"B": 2, "T": 12, "C": 24, "NH": 2},
                 {"B": 1, "T": 36, "C": 20, "NH": 4}, {"B": 3, "T": 7, "C": 9, "NH": 3},
                 {"B": 1, "T": 132, "C": 8, "NH": 2}],  # T = 132: v4's lanes loop, v2 has a partial 5th tile
    tolerance={"out": (1e-3, float(np.finfo(np.float32).eps)),
               "att": (1e-3, float(np.finfo(np.float32).eps)),
               "qkvr": (1e-5, float(np.finfo(np.float32).eps))},
    tolerance_note=(
        "out and att: llm.c's 1e-3 absolute for the FP32 versions (probabilities are <= 1 and out is a convex "
        "combination of values in [-1, 1]; FP32 dot products of HS terms and expf are ~1e-6 off, and 1e-3 also "
        "covers cuBLAS under TF32 (CUPY_TF32=1), which is why llm.c found 1e-4 too strict); the relative term is "
        "one FP32 epsilon instead of llm.c's BF16 0.079, since no version here is 16-bit. qkvr is an exact copy: "
        "the permute check, 1e-5 + FLT_EPSILON*|ref|."
    ),
    sizes_of=_sizes_of,
    bound=Bound("flops", flops=_flops, baseline=_baseline),
    notes=("preatt is scratch with a per-version meaning (see the module docstring); versions 5, 6, 10 are listed "
           "but need 16-bit arrays or cuDNN."),
)
