"""encoder_forward: out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :], GPT-2's input embedding.

``op(tokens, wte, wpe) -> out``: tokens (B, T) int32 ids in [0, V), wte (V, C), wpe (maxT, C) with
maxT >= T (only the first T rows are read), out (B, T, C). Out-of-range ids raise OpError before
any launch. A preallocated output can be given to ``op.run(version, {..., "out": o})``.
"""

from __future__ import annotations

import numpy as np

from ._op import (Bound, Op, OpError, Version, check_float32, host_checks_enabled, kernel_of, kernels_only,
                  misaligned, need)

SOURCE = "encoder_forward.cu"
_INT_MAX = 2**31 - 1


def reference(tokens, wte, wpe):
    T = tokens.shape[1]
    # one fp32 addition per element, as in llm.c's CPU reference
    return {"out": (wte[tokens] + wpe[:T][None, :, :]).astype(np.float32)}


def make_inputs(rng, B, T, C, V, maxT=None):
    maxT = T if maxT is None else maxT  # the harness allocates exactly T position rows
    return {
        "tokens": rng.integers(0, V, size=(B, T)).astype(np.int32),
        "wte": rng.uniform(-1.0, 1.0, size=(V, C)).astype(np.float32),
        "wpe": rng.uniform(-1.0, 1.0, size=(maxT, C)).astype(np.float32),
    }


def check_tokens(op_name, tokens, V):
    """tokens must be a non-empty (B, T) int32 array of ids in [0, V)."""
    if getattr(tokens, "dtype", None) != np.int32:
        raise OpError(f"{op_name}: tokens must be int32 token ids, got {getattr(tokens, 'dtype', type(tokens).__name__)}")
    need(tokens.ndim == 2, f"{op_name}: tokens must be 2-D (B, T), got shape {tokens.shape}")
    need(tokens.size > 0, f"{op_name}: tokens is empty (shape {tokens.shape})")
    if not host_checks_enabled():
        return  # the caller checked the ids (a CUDA graph capture cannot read them back)
    lo, hi = int(tokens.min()), int(tokens.max())  # one small device->host sync on the GPU
    if lo < 0 or hi >= V:
        bad = lo if lo < 0 else hi
        raise OpError(f"{op_name}: token id {bad} is out of range [0, {V}) (the table has {V} rows)")


def validate(a):
    tokens, wte, wpe = a["tokens"], a["wte"], a["wpe"]
    check_float32("encoder_forward", wte=wte, wpe=wpe, out=a.get("out"))
    need(wte.ndim == 2, f"encoder_forward: wte must be 2-D (V, C), got shape {wte.shape}")
    need(wpe.ndim == 2, f"encoder_forward: wpe must be 2-D (maxT, C), got shape {wpe.shape}")
    need(wpe.shape[1] == wte.shape[1],
         f"encoder_forward: wte and wpe must have the same C, got {wte.shape[1]} and {wpe.shape[1]}")
    check_tokens("encoder_forward", tokens, wte.shape[0])
    B, T = tokens.shape
    C = wte.shape[1]
    need(T <= wpe.shape[0], f"encoder_forward: T = {T} exceeds the {wpe.shape[0]} rows of wpe")
    need(B * T * C <= _INT_MAX, f"encoder_forward: B*T*C = {B * T * C} exceeds the kernels' int indexing")
    out = a.get("out")
    if out is not None:
        need(out.shape == (B, T, C), f"encoder_forward: out must have shape {(B, T, C)}, got {out.shape}")


def allocate(xp, a):
    out = a.get("out")
    if out is None:
        B, T = a["tokens"].shape
        out = xp.empty((B, T, a["wte"].shape[1]), dtype=xp.float32)
    return {"out": out}


def _launch(name, threads):
    @kernels_only
    def launch(a, bs):
        B, T = a["tokens"].shape
        C = a["wte"].shape[1]
        grid = max(1, -(-threads(B, T, C) // bs))
        kernel = kernel_of("encoder_forward", name)
        kernel((grid,), (bs,), (a["out"], a["tokens"], a["wte"], a["wpe"], np.int32(B), np.int32(T), np.int32(C)))

    return launch


def _requires_packed(a, bs):
    C = a["wte"].shape[1]
    if C % 4:
        return f"C = {C} must be a multiple of 4 (a float4 pack must not cross a row)"
    return misaligned(a, ("wte", "wpe", "out"))


OP = Op(
    name="encoder_forward",
    summary="token + position embedding: out[b,t] = wte[tokens[b,t]] + wpe[t]",
    source=SOURCE,
    inputs=("tokens", "wte", "wpe"),
    outputs=("out",),
    versions={
        1: Version(1, "naive: one thread per token walking its C channels (uncoalesced)",
                   _launch("encoder_forward_kernel1", lambda B, T, C: B * T)),
        2: Version(2, "one thread per output element, div/mod indexing, coalesced",
                   _launch("encoder_forward_kernel2", lambda B, T, C: B * T * C)),
        3: Version(3, "one thread per float4 pack: streaming 128-bit loads of both rows (C % 4 == 0)",
                   _launch("encoder_forward_kernel3", lambda B, T, C: B * T * C // 4), requires=_requires_packed,
                   default_block_size=512),
    },
    default_version=3,
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=validate,
    sizes={"B": 8, "T": 1024, "C": 768, "V": 50257},
    sim_sizes={"B": 2, "T": 8, "C": 64, "V": 101},
    test_shapes=[{"B": 1, "T": 1, "C": 4, "V": 3}, {"B": 2, "T": 7, "C": 13, "V": 5},
                 {"B": 3, "T": 5, "C": 36, "V": 11, "maxT": 9}, {"B": 1, "T": 13, "C": 100, "V": 50}],
    tolerance={"out": (1e-5, float(np.finfo(np.float32).eps))},
    tolerance_note=(
        "llm.c's fp32 tolerance (1e-5 + FLT_EPSILON*|ref|). Each element is one correctly rounded fp32 addition "
        "on both sides, so the kernels actually match the reference bit for bit."
    ),
    sizes_of=lambda a: {"B": a["tokens"].shape[0], "T": a["tokens"].shape[1], "C": a["wte"].shape[1]},
    # ids, the gathered wte rows, the T wpe rows (reused across the batch) and the output, once each
    bound=Bound("memory", bytes=lambda s: 4 * (s["B"] * s["T"] + 2 * s["B"] * s["T"] * s["C"] + s["T"] * s["C"])),
)
