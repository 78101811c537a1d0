"""attention_backward: backward pass of causal multi-head self-attention.

Inputs: ``dout`` (B, T, C), ``inp`` (B, T, 3C) the packed q|k|v activations, ``att`` (B, NH, T, T)
the forward's causal softmax (zero above the diagonal, as attention_forward writes it), ``NH`` the
number of heads (a Python int). Outputs: ``dinp`` (B, T, 3C), and the scratch gradients the spec's
harness compares: ``datt`` (B, NH, T, T, full matrix) and ``dpreatt`` (B, NH, T, T, gradient with
respect to the *unscaled* scores q.k, zero above the diagonal).

Every version shares one driver (permute, unpermute-backward, four strided-batched GEMMs through
``runtime.blas`` with transposes as flags, permute-backward) and differs only in the softmax-backward kernel.
"""

from __future__ import annotations

import weakref

import numpy as np

from ..runtime import blas
from ._op import ALL_BLOCK_SIZES, Bound, Op, OpError, Version, check_float32, need, scratch
from ..runtime.module import load_kernel_file

SOURCE = "attention_backward.cu"
V6_BLOCK_SIZES = ALL_BLOCK_SIZES  # template instantiations of version 6 (host dispatch)
_V6_NAMES = tuple(f"softmax_autoregressive_backward_kernel6<{bs}>" for bs in V6_BLOCK_SIZES)
NAME_EXPRESSIONS = _V6_NAMES  # template instantiations: the NVRTC compile check compiles these too


# -- reference ------------------------------------------------------------------------------------

def _split_qkv(inp, NH):
    B, T, C3 = inp.shape
    C = C3 // 3
    HS = C // NH
    qkv = inp.reshape(B, T, 3, NH, HS).transpose(2, 0, 3, 1, 4)  # (3, B, NH, T, HS)
    return qkv[0], qkv[1], qkv[2]


def reference(dout, inp, att, NH):
    # The spec's CPU reference in closed form, accumulated in float64 from the float32 inputs:
    # datt = dY V^T (full matrix), dV = att^T dY, dpreatt = scale * att * (datt - rowsum(att*datt))
    # on and below the diagonal (the softmax Jacobian contracted with datt), 0 above,
    # dQ = dpreatt K, dK = dpreatt^T Q, dinp = (dQ | dK | dV) in the packed layout.
    NH = int(NH)
    B, T, C3 = inp.shape
    C = C3 // 3
    HS = C // NH
    scale = 1.0 / np.sqrt(HS)
    q, k, v = (x.astype(np.float64) for x in _split_qkv(inp, NH))
    a = att.astype(np.float64)
    dy = dout.astype(np.float64).reshape(B, T, NH, HS).transpose(0, 2, 1, 3)
    datt = dy @ v.swapaxes(-1, -2)
    dv = a.swapaxes(-1, -2) @ dy
    lower = np.tril(np.ones((T, T), dtype=bool))
    a_low = np.where(lower, a, 0.0)
    s = (a_low * datt).sum(axis=-1, keepdims=True)
    dpreatt = np.where(lower, scale * a_low * (datt - s), 0.0)
    dq = dpreatt @ k
    dk = dpreatt.swapaxes(-1, -2) @ q
    dinp = np.stack([dq, dk, dv], axis=0).transpose(1, 3, 0, 2, 4).reshape(B, T, 3 * C)
    return {"dinp": dinp.astype(np.float32), "datt": datt.astype(np.float32),
            "dpreatt": dpreatt.astype(np.float32)}


def causal_softmax(inp, NH):
    """att = softmax over t2 <= t of scale * q.k (zeros above the diagonal), in float64 -> float32."""
    q, k, _ = (x.astype(np.float64) for x in _split_qkv(inp, NH))
    T = inp.shape[1]
    HS = q.shape[-1]
    s = (q @ k.swapaxes(-1, -2)) / np.sqrt(HS)
    mask = np.triu(np.ones((T, T), dtype=bool), k=1)
    s = np.where(mask, -np.inf, s)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def make_inputs(rng, B, T, C, NH):
    if C % NH:
        raise OpError(f"attention_backward: C = {C} must be a multiple of NH = {NH}")
    inp = rng.uniform(-1.0, 1.0, size=(B, T, 3 * C)).astype(np.float32)
    dout = rng.uniform(-1.0, 1.0, size=(B, T, C)).astype(np.float32)
    # our own forward, so the op does not depend on attention_forward's files
    att = causal_softmax(inp, NH)
    return {"dout": dout, "inp": inp, "att": att, "NH": int(NH)}


# -- validation and allocation ----------------------------------------------------------------------

def _nh(value) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise OpError("attention_backward: NH must be an integer number of heads, got a bool")
    if isinstance(value, (int, np.integer)):
        return int(value)
    # the tests copy every input with np.array(...): a 0-d integer array is accepted too
    if isinstance(value, np.ndarray) and value.ndim == 0 and np.issubdtype(value.dtype, np.integer):
        return int(value)
    raise OpError(f"attention_backward: NH must be a Python int (number of heads), got {type(value).__name__}")


def _dims(a):
    B, T, C3 = a["inp"].shape
    NH = _nh(a["NH"])
    C = C3 // 3
    return B, T, C, NH, C // NH


def validate(a):
    check_float32("attention_backward", dout=a["dout"], inp=a["inp"], att=a["att"])
    NH = _nh(a["NH"])
    inp, dout, att = a["inp"], a["dout"], a["att"]
    need(inp.ndim == 3 and inp.shape[2] % 3 == 0,
         f"attention_backward: inp must be (B, T, 3C), got shape {inp.shape}")
    B, T, C3 = inp.shape
    C = C3 // 3
    need(NH >= 1 and C % NH == 0, f"attention_backward: C = {C} must be a positive multiple of NH = {NH}")
    need(dout.shape == (B, T, C), f"attention_backward: dout must be (B, T, C) = {(B, T, C)}, got {dout.shape}")
    need(att.shape == (B, NH, T, T),
         f"attention_backward: att must be (B, NH, T, T) = {(B, NH, T, T)}, got {att.shape}")
    need(B * NH * T * T < 2**31, "attention_backward: B*NH*T*T must fit in a 32-bit int")


def allocate(xp, a):
    B, T, C, NH, HS = _dims(a)
    return {
        "dinp": xp.empty((B, T, 3 * C), dtype=np.float32),  # every element stored by permute-backward
        "datt": xp.empty((B, NH, T, T), dtype=np.float32),  # every element stored by the datt GEMM
        # zeroed by the driver before the softmax-backward kernel (see _driver)
        "dpreatt": xp.empty((B, NH, T, T), dtype=np.float32),
    }


# -- the driver ----------------------------------------------------------------------------------

def _module():
    return load_kernel_file(SOURCE, name_expressions=_V6_NAMES)


def _elementwise(name, bs, n, args):
    _module().get_function(name)((max(1, (n + bs - 1) // bs),), (bs,), args)


def _driver(softmax_backward):
    """The whole backward; ``softmax_backward(a, bs, dims)`` launches the versioned kernel."""

    def launch(a, bs):
        B, T, C, NH, HS = _dims(a)
        n = B * NH * T * HS
        i32 = np.int32
        # temporaries (a CUDA graph's workspace buffers): every element is stored before it is read
        qkvr = scratch("attention_backward", "qkvr", (3, B, NH, T, HS))
        q, k, v = qkvr[0], qkvr[1], qkvr[2]
        dy = scratch("attention_backward", "dy", (B, NH, T, HS))
        dqkvr = scratch("attention_backward", "dqkvr", (3, B, NH, T, HS))
        dq, dk, dv = dqkvr[0], dqkvr[1], dqkvr[2]

        _elementwise("attention_backward_permute_kernel", bs, n,
                     (q, k, v, a["inp"], i32(B), i32(T), i32(NH), i32(HS)))
        _elementwise("attention_backward_unpermute_kernel", bs, n,
                     (dy, a["dout"], i32(B), i32(T), i32(NH), i32(HS)))
        # strided-batched SGEMMs over the B*NH heads, transposed operands read in place (no copies)
        blas.gemm(dy, v, a["datt"], trans_b=True)               # datt = dY V^T
        blas.gemm(a["att"], dy, dv, trans_a=True)               # dV = att^T dY
        # The kernels write dpreatt's lower triangle only and the dQ/dK GEMMs read the whole
        # matrix, so the upper triangle must be zero. llm.c relies on fresh allocations being
        # zero; CuPy's pool (and a caller's out= buffer) hands back used memory: zero it the first
        # time a buffer comes here. No version writes above the diagonal, so it stays zero for the
        # buffer's life: the trainer reuses one dpreatt (201 MB at 124M, B=4, T=1024) for every
        # layer of every step and zeroes it once, not 12 times a step.
        _zero_upper_once(a["dpreatt"])
        softmax_backward(a, bs, (B, T, C, NH, HS))              # dpreatt (lower triangle)
        blas.gemm(a["dpreatt"], k, dq)                          # dQ = dpreatt K
        blas.gemm(a["dpreatt"], q, dk, trans_a=True)            # dK = dpreatt^T Q
        _elementwise("attention_backward_permute_backward_kernel", bs, n,
                     (a["dinp"], dq, dk, dv, i32(B), i32(T), i32(NH), i32(HS)))

    return launch


_ZEROED: dict = {}  # id(buffer) -> weak reference to it, for the buffers zeroed here while they live


def _zero_upper_once(buf) -> None:
    """Zeroes ``buf`` unless this very array object was zeroed here before (and is still alive).

    A caller who writes into a dpreatt buffer's upper triangle between calls must zero it again.
    An array type without weak references is zeroed every time."""
    key = id(buf)
    ref = _ZEROED.get(key)
    if ref is not None and ref() is buf:
        return
    buf.fill(0)
    try:
        _ZEROED[key] = weakref.ref(buf, lambda _, key=key: _ZEROED.pop(key, None))
    except TypeError:  # no weak references to this array type: never assume it is still zero
        pass


def _kernel_args_hs(a, dims):
    B, T, C, NH, HS = dims
    return (a["dpreatt"], a["datt"], a["att"], np.int32(B), np.int32(T), np.int32(NH), np.int32(HS))


def _kernel_args_scale(a, dims):
    B, T, C, NH, HS = dims
    scale = np.float32(1.0 / np.sqrt(HS))  # computed on the host (versions 7 and 8)
    return (a["dpreatt"], a["datt"], a["att"], np.int32(B), np.int32(T), np.int32(NH), scale)


def _sm_v1(a, bs, dims):
    T = dims[1]
    # llm.c's grid is (ceil(T/bs), B*NH) with blockIdx.y ignored: B*NH identical copies of the
    # work; one y-slice gives the same result
    _module().get_function("softmax_autoregressive_backward_kernel1")(((T + bs - 1) // bs, 1), (bs,),
                                                                       _kernel_args_hs(a, dims))


def _sm_v2(a, bs, dims):
    B, T, C, NH, HS = dims
    _module().get_function("softmax_autoregressive_backward_kernel2")(((T + bs - 1) // bs, B * NH), (bs,),
                                                                       _kernel_args_hs(a, dims))


def _sm_warp(name, columns_per_warp):
    def launch(a, bs, dims):
        B, T, C, NH, HS = dims
        warps = (T + columns_per_warp - 1) // columns_per_warp
        _module().get_function(name)(((warps * 32 + bs - 1) // bs, B * NH), (bs,), _kernel_args_hs(a, dims))

    return launch


def _sm_v6(a, bs, dims):
    B, T, C, NH, HS = dims
    _module().get_function(f"softmax_autoregressive_backward_kernel6<{bs}>")((T, B * NH), (bs,),
                                                                             _kernel_args_hs(a, dims))


def _sm_v7(a, bs, dims):
    B, T, C, NH, HS = dims
    _module().get_function("softmax_autoregressive_backward_kernel7")((T, B * NH), (bs,),
                                                                       _kernel_args_scale(a, dims))


def _sm_v8(a, bs, dims):
    B, T, C, NH, HS = dims
    _module().get_function("softmax_autoregressive_backward_kernel8")(((T + 3) // 4, B * NH), (bs,),
                                                                       _kernel_args_scale(a, dims))


V1_MAX_WORK = 2**32


def _v1_work(a, bs):
    # version 1 runs only T threads, each doing O(B*NH*T^2) serial work: at the spec's sizes
    # (B*NH*T^3 ~ 5e10) a single launch takes minutes, so the spec says to run it at reduced T
    B, T, C, NH, HS = _dims(a)
    work = B * NH * T ** 3
    return None if work <= V1_MAX_WORK else (
        f"B*NH*T^3 = {work:.2e} exceeds {V1_MAX_WORK:.2e}: the naive kernel's T threads each do O(B*NH*T^2) "
        "serial work; run it at a reduced T (T = 256 fits)")


def _v6_block(a, bs):
    return None if bs in V6_BLOCK_SIZES else (
        f"block size {bs} has no template instantiation (one of {', '.join(map(str, V6_BLOCK_SIZES))})")


# -- bound --------------------------------------------------------------------------------------------

def _sizes_of(a):
    B, T, C, NH, HS = _dims(a)
    return {"B": B, "T": T, "C": C, "NH": NH}


def _flops(s):
    # four batched GEMMs of B*NH * (T x T x HS) multiply-adds each
    return 4 * 2 * s["B"] * s["NH"] * s["T"] * s["T"] * (s["C"] // s["NH"])


def _baseline(a):
    """The same backward in plain xp: cuBLAS batched matmuls and xp elementwise softmax backward."""
    from ..runtime.backend import xp as get_xp

    xp = get_xp()
    B, T, C, NH, HS = _dims(a)
    qkv = a["inp"].reshape(B, T, 3, NH, HS).transpose(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    dy = a["dout"].reshape(B, T, NH, HS).transpose(0, 2, 1, 3)
    att = a["att"]
    datt = xp.matmul(dy, v.swapaxes(-1, -2))
    dv = xp.matmul(att.swapaxes(-1, -2), dy)
    s = (att * datt).sum(axis=-1, keepdims=True)  # att is zero above the diagonal
    dpreatt = xp.float32(1.0 / np.sqrt(HS)) * att * (datt - s)
    dq = xp.matmul(dpreatt, k)
    dk = xp.matmul(dpreatt.swapaxes(-1, -2), q)
    return xp.stack([dq, dk, dv], axis=0).transpose(1, 3, 0, 2, 4).reshape(B, T, 3 * C)


OP = Op(
    name="attention_backward",
    summary="causal multi-head attention backward: dinp (and datt, dpreatt) from dout, qkv, att",
    source=SOURCE,
    inputs=("dout", "inp", "att", "NH"),
    outputs=("dinp", "datt", "dpreatt"),
    versions={
        1: Version(1, "naive: one thread per column t3 looping over every (b, h), row and t2 (gridDim.y = 1)",
                   _driver(_sm_v1), requires=_v1_work),
        2: Version(2, "one thread per (t3, b*h), explicit indicator loops (imbalanced)", _driver(_sm_v2)),
        3: Version(3, "one warp per (t3, b*h): lanes stride t2, att[t,t3] hoisted, cg::reduce",
                   _driver(_sm_warp("softmax_autoregressive_backward_kernel3", 1))),
        4: Version(4, "one warp per 8 columns, 8 register accumulators and 8 warp reductions",
                   _driver(_sm_warp("softmax_autoregressive_backward_kernel4", 8))),
        5: Version(5, "version 4 branch-light: clamped indices, p = att*datt, t2 loop split around the diagonal",
                   _driver(_sm_warp("softmax_autoregressive_backward_kernel5", 8))),
        6: Version(6, "block per row, att*datt staged in shared-memory tiles, template BlockSize (O(t^2) per row)",
                   _driver(_sm_v6), block_sizes=V6_BLOCK_SIZES, requires=_v6_block),
        7: Version(7, "block per row, closed form: one block sum of att*datt, then O(t) stores (race fixed)",
                   _driver(_sm_v7)),
        8: Version(8, "version 7 with 4 rows per block, longest rows first, streaming final pass (race fixed)",
                   _driver(_sm_v8)),
    },
    default_version=8,
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=validate,
    sizes={"B": 4, "T": 1024, "C": 768, "NH": 12},
    sim_sizes={"B": 2, "T": 64, "C": 64, "NH": 4},
    test_shapes=[
        {"B": 1, "T": 1, "C": 8, "NH": 2},     # a single position: att = 1, dpreatt = 0
        {"B": 2, "T": 7, "C": 12, "NH": 3},    # HS = 4, T odd (not a multiple of 4 or 8)
        {"B": 1, "T": 45, "C": 10, "NH": 2},   # HS = 5, T spans two warps / v6 tiles of 32
        {"B": 1, "T": 70, "C": 6, "NH": 1},    # one head, T % 8 != 0, three lane-stride steps
    ],
    tolerance={
        "dinp": (1e-3, float(np.finfo(np.float32).eps)),
        "datt": (5e-3, float(np.finfo(np.float32).eps)),
        "dpreatt": (1e-3, float(np.finfo(np.float32).eps)),
    },
    tolerance_note=(
        "llm.c's tolerances (|ref - out| <= tol + FLT_EPSILON*|ref|), sized for cuBLAS in TF32 on sm_80+: "
        "datt 5e-3 is an HS-long dot of uniform[-1,1] values (magnitude ~ sqrt(HS)/3 ~ 3 at HS = 64) with "
        "TF32's ~5e-4 relative rounding per product; dpreatt 1e-3 is att (<= 1) times a difference of "
        "such values, and dinp 1e-3 sums dpreatt (which shrinks like 1/t along a row) against q, k in "
        "[-1, 1] and att^T dY. In fp32 (emulator, or GPU without TF32) errors are ~1e-6."
    ),
    sizes_of=_sizes_of,
    bound=Bound("flops", flops=_flops, baseline=_baseline),
    notes=(
        "att must be zero above the diagonal (the dV GEMM reads the whole matrix), as attention_forward "
        "guarantees. dinp is overwritten (the trainer's semantics; llm.c's dev harness accumulates into "
        "a zeroed buffer, the same result)."
    ),
)
