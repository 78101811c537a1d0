"""flash_attention_backward: causal attention backward from (dout, inp, out, lse), recomputing the scores.

Call: ``dinp = op(dout, inp, out, lse, NH)``: dout (B, T, C) the gradient of the attention output,
inp (B, T, 3C) the packed QKV, out and lse from flash_attention_forward. Returns dinp (B, T, 3C)
(dq | dk | dv in the packed layout), overwritten. Needs a (B, NH, T) scratch for D = rowsum(dout*out).
"""

from __future__ import annotations

import numpy as np

from . import _flash
from ._attention import causal_flops, check_packed_qkv, packed_qkv
from ._op import Bound, Op, Version, check_float32, kernels_only, need, scratch
from .attention_backward import _baseline as _attention_backward_baseline
from .attention_forward import baseline_probabilities

SOURCE = _flash.SOURCE
NAME_EXPRESSIONS = _flash.NAME_EXPRESSIONS


def reference(dout, inp, out, lse, NH):
    # exact gradients in float64 from q, k, v (out and lse are the forward's; the exact
    # probabilities are recomputed here, which is what the kernels approximate from lse)
    NH = int(NH)
    B, T, C3 = inp.shape
    C, HS = C3 // 3, C3 // 3 // NH
    q, k, v, p, _ = _flash.probabilities(inp, NH)
    dy = dout.astype(np.float64).reshape(B, T, NH, HS).transpose(0, 2, 1, 3)
    dv = p.swapaxes(-1, -2) @ dy
    dp = dy @ v.swapaxes(-1, -2)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True)) / np.sqrt(HS)
    dq, dk = ds @ k, ds.swapaxes(-1, -2) @ q
    dinp = np.stack([dq, dk, dv], axis=0).transpose(1, 3, 0, 2, 4).reshape(B, T, 3 * C)
    return {"dinp": dinp.astype(np.float32)}


def make_inputs(rng, B, T, C, NH):
    from .flash_attention_forward import reference as forward

    inp = packed_qkv(rng, B, T, C)
    dout = rng.uniform(-1.0, 1.0, size=(B, T, C)).astype(np.float32)
    f = forward(inp, NH)
    return {"dout": dout, "inp": inp, "out": f["out"], "lse": f["lse"], "NH": int(NH)}


def _dims(a):
    B, T, C, NH = check_packed_qkv("flash_attention_backward", a["inp"], a["NH"])
    check_float32("flash_attention_backward", dout=a["dout"], out=a["out"], lse=a["lse"])
    need(tuple(a["dout"].shape) == (B, T, C),
         f"flash_attention_backward: dout must be {(B, T, C)}, got {tuple(a['dout'].shape)}")
    need(tuple(a["out"].shape) == (B, T, C),
         f"flash_attention_backward: out must be {(B, T, C)} (the forward's output), got {tuple(a['out'].shape)}")
    need(tuple(a["lse"].shape) == (B, NH, T),
         f"flash_attention_backward: lse must be {(B, NH, T)} (the forward's), got {tuple(a['lse'].shape)}")
    return B, T, C, NH


def allocate(xp, a):
    B, T, C, NH = _dims(a)
    return {"dinp": xp.empty((B, T, 3 * C), dtype=np.float32)}


def _requires(a, bs):
    B, T, C, NH = _dims(a)
    return _flash.head_size_problem(C // NH)


@kernels_only
def _launch(a, bs):
    B, T, C, NH = _dims(a)
    HS = C // NH
    D = scratch("flash_attention_backward", "D", (B, NH, T))
    ints = (np.int32(B), np.int32(T), np.int32(NH), np.int32(HS), _flash.scale(HS))
    g = _flash.grid(B, T, NH)
    _flash.kernel("flash_attention_backward_dq_kernel1", HS)(
        g, (_flash.ROWS,), (a["dinp"], D, a["dout"], a["inp"], a["out"], a["lse"]) + ints)
    _flash.kernel("flash_attention_backward_dkv_kernel1", HS)(
        g, (_flash.ROWS,), (a["dinp"], a["dout"], a["inp"], a["lse"], D) + ints)


def _sizes_of(a):
    B, T, C, NH = _dims(a)
    return {"B": B, "T": T, "C": C, "NH": NH}


def _flops(s):
    # recomputed scores (dq and dkv kernels) and dP twice, dq, dk, dv: 7 HS-long products per pair
    return causal_flops(s, 7)


def _baseline(a):
    # what flash recomputes (the probabilities, on the device) plus the classic backward, both in
    # plain xp calls: the whole of it is timed as the upper bound, so nothing here goes to the host
    b = dict(a)
    b["att"], _ = baseline_probabilities(a)
    return _attention_backward_baseline(b)


OP = Op(
    name="flash_attention_backward",
    summary="flash-style causal attention backward: dinp from dout, qkv, out, lse (scores recomputed, no T x T)",
    source=SOURCE,
    inputs=("dout", "inp", "out", "lse", "NH"),
    outputs=("dinp",),
    versions={
        1: Version(1, "two kernels: dq (thread per query row, K/V tiles in shared memory) and dk/dv (thread per key "
                      "row, Q/dout tiles in shared memory); P recomputed from lse, deterministic",
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
        {"B": 1, "T": 1, "C": 8, "NH": 2},     # one position: dq = dk = 0, dv = dout
        {"B": 2, "T": 7, "C": 12, "NH": 3},    # HS = 4
        {"B": 1, "T": 70, "C": 10, "NH": 2},   # HS = 5, 2 row blocks, partial query and key tiles
        {"B": 1, "T": 33, "C": 80, "NH": 2},   # HS = 40: padded to HSMAX 64
        {"B": 1, "T": 65, "C": 128, "NH": 2},  # HS = 64 (GPT-2's), a key block plus one key
    ],
    tolerance={"dinp": (1e-3, float(np.finfo(np.float32).eps))},
    tolerance_note=(
        "attention_backward's dinp tolerance, 1e-3 + FLT_EPSILON*|ref|: dq, dk are sums over <= T of "
        "dS = P (dP - D) (|P| <= 1, dP an HS-long dot of values in [-1, 1]) times q or k in [-1, 1], scaled by "
        "1/sqrt(HS); P is recomputed as exp(s - lse) in FP32 (relative error ~ |s| * eps), and D from the "
        "forward's FP32 out; observed errors ~1e-6 at the test sizes."
    ),
    sizes_of=_sizes_of,
    bound=Bound("flops", flops=_flops, baseline=_baseline),
    notes="Needs C / NH <= 64. The D = rowsum(dout * out) scratch is (B, NH, T).",
)
