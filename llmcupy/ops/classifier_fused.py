"""classifier_fused: softmax + cross-entropy loss + logit gradient in one pass, IN PLACE.

Call (what the GPT-2 trainer does, with version 3)::

    losses, dlogits = llmcupy.ops["classifier_fused"](logits, targets, dlosses, V, version=3)
    # dlogits IS logits: the gradient overwrote the logits buffer

``logits``: float32 (B, T, P) or (N, P), C-contiguous, row stride P = the padded vocabulary Vp;
only the first ``V`` columns are real (the padding columns are never read as data and never
written). ``targets``: int32 with shape ``logits.shape[:-1]``, every id in [0, V) (checked: an
OpError names the first bad one). ``dlosses``: float32 with the shape of ``targets``, or ``None``
meaning "every dloss = 1/N" with N = B*T (the mean loss of pretraining; versions 2-5; version 1
needs the array). ``V``: the real vocabulary size, an int in [1, P] (pass ``P`` itself for an
unpadded buffer).

Returns ``losses`` (float32, the shape of ``targets``): ``-log softmax(logits[r, :V])[target_r]``,
not averaged; and ``dlogits``, which is the ``logits`` array itself, overwritten for columns < V
with ``(softmax(logits[r, :V]) - onehot(target_r)) * dloss_r``; columns V..P-1 keep their bytes.

Versions 2, 4 and 5 read 128-bit packets: they need P % 4 == 0 and a 16-byte aligned buffer.
Version 3 (the trainer's, block 1024) and version 1 have no alignment requirement.
"""

from __future__ import annotations

import numpy as np

from ._op import (ALL_BLOCK_SIZES, Bound, Op, OpError, Version, address, check_float32, kernel_of,
                  kernels_only, need)
from .crossentropy_forward import check_targets

SOURCE = "classifier_fused.cu"
NAME = "classifier_fused"


def _v(V) -> int:
    try:
        value = int(V)
    except (TypeError, ValueError):
        raise OpError(f"{NAME}: V (the real vocabulary size) must be an int, got {type(V).__name__}") from None
    if value != float(V):
        raise OpError(f"{NAME}: V (the real vocabulary size) must be an integer, got {V!r}")
    return value


def reference(logits, targets, dlosses, V):
    # llm.c's CPU reference: softmax over the V real columns with a double-precision sum, then
    # losses = -logf(probs[target]), dlogits = (probs - onehot) * dloss; the padding is untouched.
    V = _v(V)
    P = logits.shape[-1]
    x = logits.reshape(-1, P).astype(np.float32)
    n = x.shape[0]
    t = targets.reshape(-1).astype(np.int64)
    real = x[:, :V]
    e = np.exp(real - real.max(axis=1, keepdims=True))
    s = e.sum(axis=1, dtype=np.float64, keepdims=True)
    probs = (e * (1.0 / s).astype(np.float32)).astype(np.float32)
    rows = np.arange(n)
    with np.errstate(divide="ignore"):
        losses = (-np.log(probs[rows, t])).astype(np.float32)
    if dlosses is None:
        dl = np.full(n, np.float32(1.0) / np.float32(n), dtype=np.float32)
    else:
        dl = dlosses.reshape(-1).astype(np.float32)
    grad = probs.copy()
    grad[rows, t] -= np.float32(1.0)
    grad = (grad * dl[:, None]).astype(np.float32)
    dlogits = x.copy()
    dlogits[:, :V] = grad
    return {"losses": losses.reshape(targets.shape), "dlogits": dlogits.reshape(logits.shape)}


def make_inputs(rng, B, T, V, P=None):
    # llm.c's harness: logits uniform in [-1, 1] with three random real columns per row scaled by
    # 20; the padding columns V..P-1 are NaN (llm.c fills them with 0xFF bytes), so any read of
    # them as data poisons the result; targets uniform in [0, V); dlosses uniform in [-1, 1]
    # (deliberately not 1/(B*T), to exercise the dloss path).
    P = V if P is None else P
    n = B * T
    logits = np.full((n, P), np.nan, dtype=np.float32)
    logits[:, :V] = rng.uniform(-1.0, 1.0, size=(n, V)).astype(np.float32)
    cols = rng.integers(0, V, size=(n, 3))
    np.multiply.at(logits, (np.arange(n)[:, None], cols), np.float32(20.0))
    return {
        "logits": logits.reshape(B, T, P),
        "targets": rng.integers(0, V, size=(B, T)).astype(np.int32),
        "dlosses": rng.uniform(-1.0, 1.0, size=(B, T)).astype(np.float32),
        "V": np.int32(V),
    }


def validate(a):
    logits, dlosses = a["logits"], a["dlosses"]
    need(logits is not None, f"{NAME}: logits are required")
    check_float32(NAME, logits=logits, dlosses=dlosses)
    need(logits.ndim >= 2, f"{NAME}: logits must be (B, T, P) or (N, P), got shape {tuple(logits.shape)}")
    P = int(logits.shape[-1])
    need(a["V"] is not None, f"{NAME}: V (the real vocabulary size) is required; pass P={P} for unpadded logits")
    V = _v(a["V"])
    need(1 <= V <= P, f"{NAME}: V must lie in [1, P={P}] (the row stride of logits), got {V}")
    n = int(np.prod(logits.shape[:-1]))
    need(n >= 1, f"{NAME}: logits have no rows")
    need(n < 2**31, f"{NAME}: {n} rows overflow the kernels' 32-bit row count")
    if dlosses is not None:
        need(tuple(dlosses.shape) == tuple(logits.shape[:-1]),
             f"{NAME}: dlosses must have shape {tuple(logits.shape[:-1])} (or be None), got {tuple(dlosses.shape)}")
    check_targets(NAME, a["targets"], V, logits.shape[:-1])


def allocate(xp, a):
    # in place: the gradient overwrites the logits (columns < V), as in the trainer
    return {"losses": xp.empty(a["targets"].shape, dtype=np.float32), "dlogits": a["logits"]}


def _sizes(a):
    logits = a["logits"]
    return {"N": int(np.prod(logits.shape[:-1])), "V": _v(a["V"]), "P": int(logits.shape[-1])}


def _args(a):
    s = _sizes(a)
    return (a["dlogits"], a["losses"], None, a["logits"], a["dlosses"], a["targets"],
            np.int32(s["N"]), np.int32(s["V"]), np.int32(s["P"]))


def _kernel(name):
    return kernel_of(NAME, name)


@kernels_only
def _launch_v1(a, bs):
    n = _sizes(a)["N"]
    rows_per_block = bs // 32
    _kernel("classifier_fused_kernel1")(((n + rows_per_block - 1) // rows_per_block,), (bs,), _args(a))


def _block_per_row(name):
    @kernels_only
    def launch(a, bs):
        _kernel(name)((_sizes(a)["N"],), (bs,), _args(a))

    return launch


def _requires_v1(a, bs):
    return None if a["dlosses"] is not None else "needs the dlosses array (versions 2-5 accept None = 1/(B*T))"


def _requires_packets(a, bs):
    P = int(a["logits"].shape[-1])
    if P % 4:
        return f"128-bit loads need the row stride P % 4 == 0, got P = {P} (use version 3)"
    if address(a["logits"]) % 16:
        return "128-bit loads need a 16-byte aligned logits buffer (use version 3)"
    return None


OP = Op(
    name=NAME,
    summary="fused softmax + cross-entropy loss + dlogits written in place over the logits (padded rows)",
    source=SOURCE,
    inputs=("logits", "targets", "dlosses", "V"),
    optional_inputs=("dlosses",),    # None: every dloss = 1/N
    outputs=("losses", "dlogits"),
    versions={
        1: Version(1, "warp per row: cg::reduce max then sum, strided gradient pass (needs dlosses)",
                   _launch_v1, block_sizes=ALL_BLOCK_SIZES, requires=_requires_v1),
        2: Version(2, "block per row, float4 chunks, descending stats pass, 3-step cg block reduce, __ldcs",
                   _block_per_row("classifier_fused_kernel2"), block_sizes=ALL_BLOCK_SIZES,
                   requires=_requires_packets),
        3: Version(3, "version 2 with scalar loads, any P (the trainer's, block 1024; in-place race fixed)",
                   _block_per_row("classifier_fused_kernel3"), block_sizes=ALL_BLOCK_SIZES,
                   default_block_size=1024),
        4: Version(4, "128-bit packets, streaming loads in both passes, plain stores (padding no longer written)",
                   _block_per_row("classifier_fused_kernel4"), block_sizes=ALL_BLOCK_SIZES,
                   requires=_requires_packets),
        5: Version(5, "tuned 128-bit: peeled partial packet, cache-keeping loads, streaming stores, scalar tail",
                   _block_per_row("classifier_fused_kernel5"), block_sizes=ALL_BLOCK_SIZES,
                   default_block_size=1024, requires=_requires_packets),
    },
    default_version=5,
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=validate,
    sizes={"B": 8, "T": 1024, "V": 50257, "P": 50304},
    sim_sizes={"B": 2, "T": 4, "V": 1001, "P": 1024},
    test_shapes=[
        {"B": 1, "T": 1, "V": 7, "P": 8},          # a single row, V < one warp, padded
        {"B": 1, "T": 5, "V": 37, "P": 37},        # unpadded, P % 4 != 0: versions 1 and 3 only
        {"B": 3, "T": 3, "V": 1001, "P": 1024},    # V % 4 == 1, rows not a multiple of bs/32
        {"B": 2, "T": 1, "V": 256, "P": 256},      # full packets only, no tail
        {"B": 1, "T": 2, "V": 50257, "P": 50304},  # GPT-2's vocabulary and padding
    ],
    tolerance={"losses": (1e-4, float(np.finfo(np.float32).eps)),
               "dlogits": (1e-4, float(np.finfo(np.float32).eps))},
    tolerance_note=(
        "llm.c's check, 1e-4 + FLT_EPSILON*|ref|: probabilities are <= 1 and |dloss| <= 1, so each "
        "gradient is a few fp32 ulp of a value <= 1 away from the reference (fast-math exp, an fp32 "
        "sum of up to 50,257 online-rescaled terms vs the double sum: ~1e-6 relative); the loss "
        "(<= ~35) inherits that relative error of the normaliser, ~1e-5 absolute at worst."
    ),
    sizes_of=_sizes,
    # the V real logits read once and their gradients written once, plus target, dloss, loss per row
    bound=Bound("memory", bytes=lambda s: 8 * s["N"] * s["V"] + 12 * s["N"]),
    notes=(
        "Always in place (dlogits is the logits buffer), as the trainer uses it. Default version 5 (the "
        "tuned one); the trainer calls version 3 at block 1024, which needs no alignment."
    ),
)
