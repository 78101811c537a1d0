"""encoder_backward: dwte[tokens[b,t]] += dout[b,t] and dwpe[t] += dout[b,t] (accumulated).

``op(dwte, dwpe, dout, tokens) -> (dwte, dwpe)``: the gradient tables are updated in place and
returned. dwte (V, C), dwpe (maxT, C) with maxT >= T, dout (B, T, C), tokens (B, T) int32 ids in
[0, V); out-of-range ids raise OpError before any launch. The caller zeroes the gradients once per
step; version 1's atomics make the last bits depend on the order of the additions.
"""

from __future__ import annotations

import numpy as np

from ._op import Bound, Op, Version, check_float32, kernel_of, kernels_only, need
from .encoder_forward import check_tokens

SOURCE = "encoder_backward.cu"
_INT_MAX = 2**31 - 1


def reference(dwte, dwpe, dout, tokens):
    # llm.c's scatter-add, accumulated in float64 from the fp32 initial values and rounded once
    B, T, C = dout.shape
    dwte64 = dwte.astype(np.float64)
    dwpe64 = dwpe.astype(np.float64)
    d = dout.astype(np.float64).reshape(B * T, C)
    np.add.at(dwte64, tokens.reshape(-1), d)
    dwpe64[:T] += d.reshape(B, T, C).sum(axis=0)
    return {"dwte": dwte64.astype(np.float32), "dwpe": dwpe64.astype(np.float32)}


def make_inputs(rng, B, T, C, V, maxT=None):
    maxT = T if maxT is None else maxT
    return {
        # nonzero initial gradients, so the test sees that the kernels accumulate
        "dwte": rng.uniform(-1.0, 1.0, size=(V, C)).astype(np.float32),
        "dwpe": rng.uniform(-1.0, 1.0, size=(maxT, C)).astype(np.float32),
        "dout": rng.uniform(-1.0, 1.0, size=(B, T, C)).astype(np.float32),
        "tokens": rng.integers(0, V, size=(B, T)).astype(np.int32),
    }


def validate(a):
    dwte, dwpe, dout, tokens = a["dwte"], a["dwpe"], a["dout"], a["tokens"]
    check_float32("encoder_backward", dwte=dwte, dwpe=dwpe, dout=dout)
    need(dwte.ndim == 2, f"encoder_backward: dwte must be 2-D (V, C), got shape {dwte.shape}")
    need(dwpe.ndim == 2, f"encoder_backward: dwpe must be 2-D (maxT, C), got shape {dwpe.shape}")
    need(dout.ndim == 3, f"encoder_backward: dout must be 3-D (B, T, C), got shape {dout.shape}")
    check_tokens("encoder_backward", tokens, dwte.shape[0])
    B, T, C = dout.shape
    need(tokens.shape == (B, T), f"encoder_backward: tokens must have shape {(B, T)} to match dout, got {tokens.shape}")
    need(dwte.shape[1] == C and dwpe.shape[1] == C,
         f"encoder_backward: dwte and dwpe must have C = {C} columns, got {dwte.shape[1]} and {dwpe.shape[1]}")
    need(T <= dwpe.shape[0], f"encoder_backward: T = {T} exceeds the {dwpe.shape[0]} rows of dwpe")
    need(B * T * C <= _INT_MAX, f"encoder_backward: B*T*C = {B * T * C} exceeds the kernels' int indexing")


def allocate(xp, a):
    return {"dwte": a["dwte"], "dwpe": a["dwpe"]}  # accumulated in place


def _launch(name, threads):
    @kernels_only
    def launch(a, bs):
        B, T, C = a["dout"].shape
        grid = max(1, -(-threads(B, T, C) // bs))
        kernel = kernel_of("encoder_backward", name)
        kernel((grid,), (bs,), (a["dwte"], a["dwpe"], a["dout"], a["tokens"], np.int32(B), np.int32(T), np.int32(C)))

    return launch


OP = Op(
    name="encoder_backward",
    summary="embedding gradients: dwte[tokens] += dout, dwpe[t] += dout (accumulated in place)",
    source=SOURCE,
    inputs=("dwte", "dwpe", "dout", "tokens"),
    outputs=("dwte", "dwpe"),
    versions={
        1: Version(1, "one thread per dout element, two fp32 atomicAdds (nondeterministic order)",
                   _launch("encoder_backward_kernel1", lambda B, T, C: B * T * C), deterministic=False),
        2: Version(2, "one thread per channel, serial over tokens, no atomics (deterministic, little parallelism)",
                   _launch("encoder_backward_kernel2", lambda B, T, C: C)),
    },
    # 2, not the faster 1: the trainer's default step must give the same losses run after run (and a
    # resumed run the same as an uninterrupted one), as llm.c's mainline made its encoder backward
    default_version=2,
    default_note="not llm.c's 1 (its harness default and its FP32 trainer's, the faster): 1's fp32 atomics "
                 "add in a varying order, and the trainer's default step must give the same losses run after run",
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=validate,
    sizes={"B": 8, "T": 1024, "C": 768, "V": 50257},
    sim_sizes={"B": 2, "T": 8, "C": 64, "V": 101},
    test_shapes=[{"B": 1, "T": 1, "C": 4, "V": 3}, {"B": 2, "T": 7, "C": 13, "V": 5},
                 {"B": 3, "T": 5, "C": 36, "V": 11, "maxT": 9}, {"B": 4, "T": 3, "C": 100, "V": 50}],
    tolerance={"dwte": (1e-5, float(np.finfo(np.float32).eps)), "dwpe": (1e-5, float(np.finfo(np.float32).eps))},
    tolerance_note=(
        "llm.c's fp32 tolerance (1e-5 + FLT_EPSILON*|ref|) against a float64 reference. An element receiving m "
        "addends of |x| <= 1 onto an initial |g| <= 1 has partial sums |s_k| <= k+1, each rounded by at most "
        "2^-24*|s_k|, so it is off by <= 2^-24*m*(m+3)/2 whatever the (atomic, nondeterministic) order: 2.6e-6 "
        "for m = 8, within 1e-5 up to m = 16. dwpe gets B <= 8 addends; with uniform ids a dwte row gets only a "
        "few (the test shapes keep B*T/V small)."
    ),
    sizes_of=lambda a: {"B": a["dout"].shape[0], "T": a["dout"].shape[1], "C": a["dout"].shape[2]},
    # dout once, the touched dwte rows and the T dwpe rows read and written once, the ids
    bound=Bound("memory", bytes=lambda s: 4 * (3 * s["B"] * s["T"] * s["C"] + 2 * s["T"] * s["C"] + s["B"] * s["T"])),
)
