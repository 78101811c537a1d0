"""flash_attention_forward: causal multi-head self-attention forward without the (B, NH, T, T) matrix.

Call: ``out, lse = op(inp, NH)``. inp (B, T, 3C) is the packed QKV projection (as attention_forward);
out (B, T, C) the attention output, lse (B, NH, T) the log-sum-exp of each row's scaled scores,
all the backward (flash_attention_backward) needs besides inp and out to recompute the
probabilities. Unlike attention_forward it produces no att and no qkvr, by design.
"""

from __future__ import annotations

import numpy as np

from . import _flash
from ._attention import causal_flops, check_packed_qkv, packed_qkv
from ._op import Bound, Op, Version, kernels_only
from .attention_forward import _baseline as _attention_baseline

SOURCE = _flash.SOURCE
NAME_EXPRESSIONS = _flash.NAME_EXPRESSIONS  # template instances: the NVRTC compile check compiles these


def reference(inp, NH):
    NH = int(NH)
    B, T, C3 = inp.shape
    _, _, v, p, lse = _flash.probabilities(inp, NH)
    out = (p @ v).transpose(0, 2, 1, 3).reshape(B, T, C3 // 3)
    return {"out": out.astype(np.float32), "lse": lse.astype(np.float32)}


def make_inputs(rng, B, T, C, NH):
    return {"inp": packed_qkv(rng, B, T, C), "NH": int(NH)}


def _dims(a):
    return check_packed_qkv("flash_attention_forward", a["inp"], a["NH"])


def allocate(xp, a):
    B, T, C, NH = _dims(a)
    return {"out": xp.empty((B, T, C), dtype=np.float32), "lse": xp.empty((B, NH, T), dtype=np.float32)}


def _requires(a, bs):
    B, T, C, NH = _dims(a)
    return _flash.head_size_problem(C // NH)


@kernels_only
def _launch(a, bs):
    B, T, C, NH = _dims(a)
    HS = C // NH
    _flash.kernel("flash_attention_forward_kernel1", HS)(
        _flash.grid(B, T, NH), (_flash.ROWS,),
        (a["out"], a["lse"], a["inp"], np.int32(B), np.int32(T), np.int32(NH), np.int32(HS), _flash.scale(HS)))


def _sizes_of(a):
    B, T, C, NH = _dims(a)
    return {"B": B, "T": T, "C": C, "NH": NH}


def _flops(s):
    # Q K^T and P V over the causal pairs
    return causal_flops(s, 2)


OP = Op(
    name="flash_attention_forward",
    summary="flash-style causal attention forward: (B, T, 3C), NH -> out (B, T, C), lse (B, NH, T); no T x T matrix",
    source=SOURCE,
    inputs=("inp", "NH"),
    outputs=("out", "lse"),
    versions={
        1: Version(1, "thread per query row, 64-row blocks, K/V tiles of 32 keys in shared memory, online softmax "
                      "in registers, reads the packed QKV, writes out and the row log-sum-exp",
                   _launch, block_sizes=(_flash.ROWS,), default_block_size=_flash.ROWS, requires=_requires),
    },
    default_version=1,
    default_note="an op of llmcupy's own, past llm.c's FP32 ladder: its one version",
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=lambda a: _dims(a),
    sizes={"B": 4, "T": 1024, "C": 768, "NH": 12},
    sim_sizes={"B": 1, "T": 64, "C": 64, "NH": 4},
    test_shapes=[
        {"B": 1, "T": 1, "C": 8, "NH": 2},     # one position: out = v, lse = its only score
        {"B": 2, "T": 7, "C": 12, "NH": 3},    # HS = 4, one partial tile
        {"B": 1, "T": 70, "C": 10, "NH": 2},   # HS = 5 (odd), 2 query blocks, 3 key tiles, partial ones
        {"B": 1, "T": 33, "C": 80, "NH": 2},   # HS = 40 (HSMAX 64 with padding), a key tile plus one key
        {"B": 2, "T": 65, "C": 128, "NH": 2},  # HS = 64 (GPT-2's): HSMAX 64 exactly, a row block plus one row
    ],
    tolerance={"out": (1e-3, float(np.finfo(np.float32).eps)), "lse": (1e-3, float(np.finfo(np.float32).eps))},
    tolerance_note=(
        "out: attention_forward's 1e-3 absolute (a convex combination of values in [-1, 1]; the FP32 online "
        "softmax rescales by exp(m_old - m_new) once per 32-key tile, adding a few ulp per tile; observed "
        "~1e-6). lse = m + log(l) is ~log(T) + O(scores) in size; FP32 sums of <= T exponentials <= 1 are off by "
        "~T * eps relative to l, i.e. ~1e-4 absolute in lse at T = 1024, so the same 1e-3 holds."
    ),
    sizes_of=_sizes_of,
    bound=Bound("flops", flops=_flops, baseline=_attention_baseline),
    notes="Needs C / NH <= 64. Produces no att/qkvr: the model keeps lse instead (see the trainer's flash mode).",
)
