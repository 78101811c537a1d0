"""fused_residual_forward: residual add fused with the LayerNorm that follows it.

``op(residual, inp, weight, bias) -> (residual_out, normed, mean, rstd)`` with
residual_out = residual + inp, normed = LayerNorm(residual_out) (eps 1e-5, biased variance), and
mean/rstd the per-row statistics. residual and inp are (..., C), typically (B, T, C); mean and
rstd have the leading shape. Preallocated outputs can be given to ``op.run(version, {...,
"residual_out": r, "normed": n, "mean": m, "rstd": s})`` (all four, or any subset).
"""

from __future__ import annotations

import numpy as np

from ..runtime import backend as _backend
from ._op import Bound, Op, Version, check_float32, kernel_of, kernels_only, misaligned, need

SOURCE = "fused_residual_forward.cu"
_INT_MAX = 2**31 - 1
_EPS = 1e-5


def reference(residual, inp, weight, bias):
    # r in fp32 (one addition, as in llm.c), then layernorm_forward's two-pass statistics on that
    # fp32 r, evaluated in float64 and rounded once
    r = (residual.astype(np.float32) + inp.astype(np.float32)).astype(np.float32)
    r64 = r.astype(np.float64)
    m = r64.mean(axis=-1)
    v = ((r64 - m[..., None]) ** 2).mean(axis=-1)
    s = 1.0 / np.sqrt(v + _EPS)
    normed = (r64 - m[..., None]) * s[..., None] * weight.astype(np.float64) + bias.astype(np.float64)
    return {"residual_out": r, "normed": normed.astype(np.float32), "mean": m.astype(np.float32),
            "rstd": s.astype(np.float32)}


def make_inputs(rng, B, T, C):
    # the harness's distribution: everything uniform in [-1, 1]
    u = lambda *shape: rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)
    return {"residual": u(B, T, C), "inp": u(B, T, C), "weight": u(C), "bias": u(C)}


_OUTPUTS = ("residual_out", "normed", "mean", "rstd")


def validate(a):
    res, inp, w, b = a["residual"], a["inp"], a["weight"], a["bias"]
    check_float32("fused_residual_forward", residual=res, inp=inp, weight=w, bias=b,
                  **{k: a.get(k) for k in _OUTPUTS})
    need(res.ndim >= 2, f"fused_residual_forward: residual must be (..., C) with at least 2 dims, got {res.shape}")
    need(inp.shape == res.shape,
         f"fused_residual_forward: inp must have residual's shape {res.shape}, got {inp.shape}")
    C = res.shape[-1]
    need(w.shape == (C,) and b.shape == (C,),
         f"fused_residual_forward: weight and bias must be ({C},), got {w.shape} and {b.shape}")
    need(res.size > 0, f"fused_residual_forward: empty input (shape {res.shape})")
    need(res.size <= _INT_MAX, f"fused_residual_forward: {res.size} elements exceed the kernels' int indexing")
    for k, shape in (("residual_out", res.shape), ("normed", res.shape), ("mean", res.shape[:-1]),
                     ("rstd", res.shape[:-1])):
        if a.get(k) is not None:
            need(a[k].shape == shape, f"fused_residual_forward: {k} must have shape {shape}, got {a[k].shape}")


def allocate(xp, a):
    shape = a["residual"].shape
    out = {}
    for k, s in (("residual_out", shape), ("normed", shape), ("mean", shape[:-1]), ("rstd", shape[:-1])):
        out[k] = a[k] if a.get(k) is not None else xp.empty(s, dtype=xp.float32)
    return out


def _nc(a):
    C = a["residual"].shape[-1]
    return a["residual"].size // C, C


def _kernel(name):
    return kernel_of("fused_residual_forward", name)


def _args(a):
    N, C = _nc(a)
    return (a["residual_out"], a["normed"], a["mean"], a["rstd"], a["residual"], a["inp"], a["weight"], a["bias"],
            np.int32(N), np.int32(C))


def _device_limits():
    """(resident threads on the whole device, max dynamic shared memory per block in bytes).

    On the emulator the device is pretended to hold 512 resident threads, so that version 6's
    persistent grid is smaller than the work and its grid-stride loop is exercised by the tests.
    """
    if _backend.is_sim():
        return 512, 227 * 1024
    # cached per device (Device().attributes queried every attribute on every launch)
    attr = _backend.device_attribute
    return attr("MultiProcessorCount") * attr("MaxThreadsPerMultiProcessor"), attr("MaxSharedMemoryPerBlockOptin")


@kernels_only
def _launch_v1(a, bs):
    N, C = _nc(a)
    _kernel("fused_residual_forward_add_kernel1")(
        (max(1, -(-N * C // bs)),), (bs,), (a["residual_out"], a["residual"], a["inp"], np.int32(N * C)))
    _kernel("fused_residual_forward_layernorm_kernel1")(
        (max(1, -(-N // bs)),), (bs,),
        (a["normed"], a["mean"], a["rstd"], a["residual_out"], a["weight"], a["bias"], np.int32(N), np.int32(C)))


@kernels_only
def _launch_v2(a, bs):
    N, _ = _nc(a)
    _kernel("fused_residual_forward_kernel2")((max(1, -(-N // bs)),), (bs,), _args(a))


def _warp_per_row(name, smem_floats=None):
    @kernels_only
    def launch(a, bs):
        N, C = _nc(a)
        rows = bs // 32
        smem = 4 * smem_floats(rows, C) if smem_floats else 0
        _kernel(name)((max(1, -(-N // rows)),), (32, rows), _args(a), shared_mem=smem)

    return launch


def _v6_shape(C, bs):
    """(y, z, shared bytes): y warps per token, z token slots per block (llm.c's launch rule)."""
    warps = bs // 32
    warps_per_token = max(1, C // 4 // 32)
    z = max(1, warps // warps_per_token)
    y = max(1, warps // z)
    return y, z, (2 + z) * C * 4 + 64 * 4 * z


@kernels_only
def _launch_v6(a, bs):
    N, C = _nc(a)
    y, z, smem = _v6_shape(C, bs)
    resident, _ = _device_limits()
    grid = max(1, resident // bs)          # fill the device once ...
    grid = min(grid, -(-N // z))           # ... but no block without a token
    _kernel("fused_residual_forward_kernel6")((grid,), (32, y, z), _args(a), shared_mem=smem)


def _requires_packed(smem_bytes=None):
    def requires(a, bs):
        N, C = _nc(a)
        if C % 4:
            return f"C = {C} must be a multiple of 4 (float4 packs)"
        if alignment := misaligned(a, ("residual", "inp", "weight", "bias", "residual_out", "normed")):
            return alignment
        if smem_bytes is not None:
            need_bytes = smem_bytes(C, bs)
            _, limit = _device_limits()
            if need_bytes > limit:
                return (f"block size {bs} needs {need_bytes} bytes of shared memory at C = {C}, more than the "
                        f"device's {limit} per block")
        return None

    return requires


OP = Op(
    name="fused_residual_forward",
    summary="residual add fused with LayerNorm: (residual + inp, LN(residual + inp), mean, rstd)",
    source=SOURCE,
    inputs=("residual", "inp", "weight", "bias"),
    outputs=_OUTPUTS,
    versions={
        1: Version(1, "unfused: elementwise add kernel, then naive LayerNorm (one thread per row)", _launch_v1),
        2: Version(2, "naive fusion: one thread per row, two-pass, residual re-read from global (uncoalesced)",
                   _launch_v2),
        3: Version(3, "one warp per row, scalar coalesced accesses, two-pass variance via global re-reads",
                   _warp_per_row("fused_residual_forward_kernel3")),
        4: Version(4, "warp per row, float4, one-pass E[r^2]-m^2 statistics, zig-zag reverse second pass",
                   _warp_per_row("fused_residual_forward_kernel4"), requires=_requires_packed()),
        5: Version(5, "warp per row, float4, weight/bias and residual rows in shared memory, two-pass",
                   _warp_per_row("fused_residual_forward_kernel5", lambda rows, C: (2 + rows) * C),
                   requires=_requires_packed(lambda C, bs: (2 + bs // 32) * C * 4)),
        6: Version(6, "persistent: (32, y, z) blocks, y warps per token, weight/bias staged once per block",
                   _launch_v6, requires=_requires_packed(lambda C, bs: _v6_shape(C, bs)[2])),
    },
    default_version=6,
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=validate,
    sizes={"B": 8, "T": 1024, "C": 768},
    sim_sizes={"B": 2, "T": 8, "C": 64},
    test_shapes=[{"B": 1, "T": 1, "C": 4}, {"B": 3, "T": 7, "C": 20}, {"B": 2, "T": 3, "C": 7},
                 {"B": 1, "T": 5, "C": 260}, {"B": 2, "T": 13, "C": 36}],
    tolerance={k: (1e-5, float(np.finfo(np.float32).eps)) for k in _OUTPUTS},
    tolerance_note=(
        "llm.c's fp32 tolerance (1e-5 + FLT_EPSILON*|ref|) for all four outputs, against float64 statistics of the "
        "fp32 residual. residual_out is one correctly rounded addition (exact match). With |r| <= 2 and C <= 768 "
        "the fp32 sums of the mean and variance err by ~C*2^-24 relative at worst (1e-6 typical), and rsqrtf "
        "adds ~2 ulp, so rstd (~1.2) and normed (|.| <= ~4) stay within 1e-5; version 4's E[r^2]-m^2 only "
        "cancels when |mean| >> std, not the case for zero-mean inputs."
    ),
    sizes_of=lambda a: dict(zip(("N", "C"), _nc(a))),
    # inp1, inp2, weight, bias read; residual, normed, mean, rstd written: once each
    bound=Bound("memory", bytes=lambda s: 4 * (4 * s["N"] * s["C"] + 2 * s["C"] + 2 * s["N"])),
)
