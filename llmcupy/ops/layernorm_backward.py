"""layernorm_backward: LayerNorm's input and parameter gradients, accumulated (+=) as in llm.c."""

from __future__ import annotations

import numpy as np

from ..runtime import backend as _backend
from ._op import Bound, Op, Version, check_float32, kernel_of, kernels_only, misaligned, need, scratch

SOURCE = "layernorm_backward.cu"
EPS = 1e-5
COPY_BLOCK = 512      # version 2's folding kernel: one block of 512 threads
C_PER_ITER = 128      # versions 8-10: one float4 per lane per iteration
SIM_NUM_SMS = 3       # the emulator's pretend SM count (small: grid-stride loops wrap at test sizes)


def reference(dinp, dweight, dbias, dout, inp, weight, mean, rstd):
    # llm.c's CPU backward, in float64, added onto the incoming gradients.
    x = inp.astype(np.float64)
    g = dout.astype(np.float64)
    m = mean.astype(np.float64)[..., None]
    s = rstd.astype(np.float64)[..., None]
    norm = (x - m) * s
    dnorm = weight.astype(np.float64) * g
    a = dnorm.mean(axis=-1, keepdims=True)
    b = (dnorm * norm).mean(axis=-1, keepdims=True)
    c = x.shape[-1]
    return {
        "dinp": (dinp.astype(np.float64) + s * (dnorm - a - norm * b)).astype(np.float32),
        "dweight": (dweight.astype(np.float64) + (norm * g).reshape(-1, c).sum(axis=0)).astype(np.float32),
        "dbias": (dbias.astype(np.float64) + g.reshape(-1, c).sum(axis=0)).astype(np.float32),
    }


def make_inputs(rng, B, T, C):
    # llm.c's harness: inp, weight, bias, dout uniform in [-1, 1], mean / rstd from the forward.
    # The gradient buffers start nonzero (uniform in [-1, 1]) so that the accumulation is tested.
    from .layernorm_forward import reference as forward_reference

    inp = rng.uniform(-1.0, 1.0, size=(B, T, C)).astype(np.float32)
    weight = rng.uniform(-1.0, 1.0, size=(C,)).astype(np.float32)
    bias = rng.uniform(-1.0, 1.0, size=(C,)).astype(np.float32)
    dout = rng.uniform(-1.0, 1.0, size=(B, T, C)).astype(np.float32)
    fwd = forward_reference(inp, weight, bias)
    return {
        "dinp": rng.uniform(-1.0, 1.0, size=(B, T, C)).astype(np.float32),
        "dweight": rng.uniform(-1.0, 1.0, size=(C,)).astype(np.float32),
        "dbias": rng.uniform(-1.0, 1.0, size=(C,)).astype(np.float32),
        "dout": dout,
        "inp": inp,
        "weight": weight,
        "mean": fwd["mean"],
        "rstd": fwd["rstd"],
    }


def validate(a):
    check_float32("layernorm_backward", **{k: a[k] for k in
                                          ("dinp", "dweight", "dbias", "dout", "inp", "weight", "mean", "rstd")})
    inp = a["inp"]
    need(inp.ndim >= 2, f"layernorm_backward: inp must be (B, T, C) or (N, C), got shape {inp.shape}")
    need(inp.size >= 1, f"layernorm_backward: inp must not be empty, got shape {inp.shape}")
    c = inp.shape[-1]
    for k in ("dinp", "dout"):
        need(a[k].shape == inp.shape, f"layernorm_backward: {k} must have inp's shape {inp.shape}, got {a[k].shape}")
    for k in ("dweight", "dbias", "weight"):
        need(a[k].shape == (c,), f"layernorm_backward: {k} must have shape ({c},) to match inp's C, got {a[k].shape}")
    for k in ("mean", "rstd"):
        need(a[k].shape == inp.shape[:-1],
             f"layernorm_backward: {k} must have shape {inp.shape[:-1]} (one value per row), got {a[k].shape}")


def allocate(xp, a):
    # the outputs are the incoming gradient buffers, updated in place (+=)
    return {"dinp": a["dinp"], "dweight": a["dweight"], "dbias": a["dbias"]}


def _nc(a):
    c = a["inp"].shape[-1]
    return a["inp"].size // c, c


def _rounded_c(c):
    return (c + C_PER_ITER - 1) // C_PER_ITER * C_PER_ITER


def _num_sms() -> int:
    if _backend.is_sim():
        return SIM_NUM_SMS
    return _backend.device_attribute("MultiProcessorCount")  # cached: no query per launch


def _kernel(name):
    return kernel_of("layernorm_backward", name)


def _tail(a):
    n, c = _nc(a)
    return (a["dout"], a["inp"], a["weight"], a["mean"], a["rstd"], np.int32(n), np.int32(c))


def _args(a):
    return (a["dinp"], a["dweight"], a["dbias"]) + _tail(a)


def _args_scratch(a, scratch):
    return (a["dinp"], a["dweight"], a["dbias"], scratch) + _tail(a)


@kernels_only
def _launch_v1(a, bs):
    n, _ = _nc(a)
    _kernel("layernorm_backward_kernel1")(((n + bs - 1) // bs,), (bs,), _args(a))


@kernels_only
def _launch_v2(a, bs):
    n, c = _nc(a)
    # fp32 temporaries the blocks add into with atomics: zeroed here, on every call, as llm.c does
    dweight_acc = scratch("layernorm_backward", "dweight_acc", (c,), fill=0.0)
    dbias_acc = scratch("layernorm_backward", "dbias_acc", (c,), fill=0.0)
    _kernel("layernorm_backward_kernel2")(
        ((32 * n + bs - 1) // bs,), (bs,), (a["dinp"], dweight_acc, dbias_acc) + _tail(a), shared_mem=2 * c * 4)
    _kernel("layernorm_backward_copy_kernel2")(
        (1,), (COPY_BLOCK,), (a["dweight"], a["dbias"], dweight_acc, dbias_acc, np.int32(c)))


@kernels_only
def _launch_v3(a, bs):
    _, c = _nc(a)
    grid = (1024 // bs) * _num_sms()
    _kernel("layernorm_backward_kernel3")((grid,), (bs,), _args(a), shared_mem=2 * c * 4)


@kernels_only
def _launch_v5(a, bs):
    _, c = _nc(a)
    grid = _num_sms()
    # per-block slices of dbias and dweight, then the last-block counter, which must start at 0
    buf = scratch("layernorm_backward", "v5", (grid * 2 * c + 1,), fill=0.0)
    _kernel("layernorm_backward_kernel5")((grid,), (bs,), _args_scratch(a, buf), shared_mem=(2 * c + 1) * 4)


def _launch_shared_scratch(name):
    @kernels_only
    def launch(a, bs):
        _, c = _nc(a)
        grid = (1024 // bs) * _num_sms()
        # dbias, dweight accumulated with atomics, then the counter: all must start at 0
        buf = scratch("layernorm_backward", "shared", (2 * c + 1,), fill=0.0)
        _kernel(name)((grid,), (bs,), _args_scratch(a, buf), shared_mem=(2 * c + 1) * 4)

    return launch


@kernels_only
def _launch_v8(a, bs):
    _, c = _nc(a)
    cr = _rounded_c(c)
    grid = (1024 // bs) * _num_sms()
    buf = scratch("layernorm_backward", "v8", (2 * cr + 1,), fill=0.0)  # atomics targets + counter
    _kernel("layernorm_backward_kernel8")((grid,), (bs,), _args_scratch(a, buf), shared_mem=(2 * cr + 1) * 4)


def _sliced_scratch(grid, cr):
    # counter at float 0, block k's partials at float 32 + 2*cr*k; every block writes its whole
    # slice, so only the counter needs zeroing
    return scratch("layernorm_backward", "sliced", (32 + grid * 2 * cr,), fill=0.0, fill_count=32)


@kernels_only
def _launch_v9(a, bs):
    _, c = _nc(a)
    cr = _rounded_c(c)
    grid = (1024 // bs) * _num_sms()
    _kernel("layernorm_backward_kernel9")((grid,), (bs,), _args_scratch(a, _sliced_scratch(grid, cr)),
                                          shared_mem=(2 * cr + 2 * bs + 1) * 4)


@kernels_only
def _launch_v10(a, bs):
    _, c = _nc(a)
    cr = _rounded_c(c)
    bs = min(bs, 512)  # __launch_bounds__(512, 2): llm.c runs a 1024-thread request as 512
    grid = (1024 // bs) * _num_sms()
    _kernel("layernorm_backward_kernel10")((grid,), (bs,), _args_scratch(a, _sliced_scratch(grid, cr)),
                                           shared_mem=(2 * cr + 2 * 4 * (bs - 32) + 1) * 4)


def _requires_float4(a, bs):
    c = a["inp"].shape[-1]
    if c % 4:
        return f"C = {c} must be a multiple of 4 (rows are read and written as float4)"
    return misaligned(a, ("dinp", "dout", "inp", "weight"))


OP = Op(
    name="layernorm_backward",
    summary="LayerNorm backward: dinp, dweight, dbias accumulated (+=) from dout, inp, weight, mean, rstd",
    source=SOURCE,
    inputs=("dinp", "dweight", "dbias", "dout", "inp", "weight", "mean", "rstd"),
    outputs=("dinp", "dweight", "dbias"),
    versions={
        1: Version(1, "naive: one thread per row, global atomics for dweight / dbias", _launch_v1,
                   deterministic=False),
        2: Version(2, "warp per row, shared partials, atomics into zeroed temporaries + a folding kernel "
                      "(the fp32 trainer's, block 512)", _launch_v2, default_block_size=512, deterministic=False),
        3: Version(3, "persistent grid (1024/block * SMs), warps loop over rows, one global atomic per "
                      "channel per block", _launch_v3, deterministic=False),
        4: Version(4, "bf16 compare-and-swap on packed pairs", unavailable=(
            "bf16 only: its final update is a 32-bit compare-and-swap loop on pairs of bf16 values, which has "
            "no fp32 form (llm.c builds it only with bf16)")),
        5: Version(5, "one block per SM, per-block scratch slices, the last block sums them", _launch_v5,
                   deterministic=False),   # the slices are summed in order, but filled by shared atomics
        6: Version(6, "blocks add partials into one scratch with atomics, the last block adds it out",
                   _launch_shared_scratch("layernorm_backward_kernel6"), deterministic=False),
        7: Version(7, "version 6 with plain shuffles instead of cooperative groups",
                   _launch_shared_scratch("layernorm_backward_kernel7"), deterministic=False),
        8: Version(8, "float4 accesses, bank-friendly permuted shared partials, wrap-around counter "
                      "(C % 4 == 0; llm.c's C % 128 tail bug fixed)", _launch_v8, requires=_requires_float4,
                   deterministic=False),
        9: Version(9, "as 8 without shared atomics, per-block scratch slices summed in block order "
                      "(C % 4 == 0)", _launch_v9, requires=_requires_float4),
        10: Version(10, "float4 exchange between warps, natural-order partials, first pass on dnorm * x "
                        "(C % 4 == 0; 1024-thread blocks run as 512)", _launch_v10, requires=_requires_float4,
                    default_block_size=512),
    },
    default_version=10,
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=validate,
    sizes={"B": 8, "T": 1024, "C": 1600},
    sim_sizes={"B": 2, "T": 8, "C": 1600},
    test_shapes=[{"B": 1, "T": 1, "C": 64}, {"B": 1, "T": 5, "C": 100}, {"B": 2, "T": 35, "C": 64},
                 {"B": 1, "T": 3, "C": 37}, {"B": 1, "T": 2, "C": 768}],
    tolerance={
        "dinp": (1e-3, float(np.finfo(np.float32).eps)),
        "dweight": (1e-3, float(np.finfo(np.float32).eps)),
        "dbias": (1e-3, float(np.finfo(np.float32).eps)),
    },
    tolerance_note=(
        "llm.c's fp32 tolerances: 1e-3 absolute plus one fp32 epsilon relative for all three. dinp sums two fp32 "
        "row means of C <= 1600 terms of magnitude <= ~1.7 (|w*dout| <= 1, |norm| <= ~1.7) scaled by rstd ~ 1.7: "
        "errors ~1e-6. dweight / dbias are sums over N = B*T rows in a run-dependent (atomic) or blocked order; "
        "with N = 8192 terms of magnitude ~1 the fp32 error is ~1e-4 at worst, inside 1e-3."
    ),
    sizes_of=lambda a: {"N": _nc(a)[0], "C": _nc(a)[1]},
    # dout, inp read, dinp read and written; weight read, mean and rstd read; dweight, dbias read + written
    bound=Bound("memory", bytes=lambda s: 4 * (4 * s["N"] * s["C"] + 2 * s["N"] + 5 * s["C"])),
)
