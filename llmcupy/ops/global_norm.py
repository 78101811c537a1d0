"""global_norm: the SQUARED L2 norm of a flat float32 array, for gradient clipping.

Call::

    out = llmcupy.ops["global_norm"](data)      # out: float32 array of shape (1,)
    norm = float(out[0]) ** 0.5                 # the caller takes the square root

``data``: float32, any shape (treated as flat, ``count = data.size``), C-contiguous. The result is
``out[0] = sum(data**2)`` -- the **squared** norm, no square root -- accumulated in fp32 on the
device (per-thread grid-stride sums, then warp/block reductions, then atomics or a second kernel).
Versions 1-3 accumulate into ``out`` with atomicAdd; their launcher zeroes it first (with a kernel,
so a launch plan's replay does too), so every call returns the norm of this call's data only. Version 4 is deterministic (no atomics).

Grid: enough blocks to fill the device once, ``maxThreadsPerSM * numSMs // block`` (read from the
GPU with CuPy; a fixed 2 SMs x 2048 threads in the emulator), and never more than the data needs;
version 4 also caps it at 1024 blocks, so it works on any SM count (llm.c's assertion fails on
132-SM parts).
"""

from __future__ import annotations

import numpy as np

from ..runtime import backend as _backend
from ..sim.launcher import DEVICE_MAX_THREADS_PER_SM, DEVICE_SMS
from ._op import Bound, Op, Version, check_float32, kernel_of, kernels_only, need, scratch

SOURCE = "global_norm.cu"
NAME = "global_norm"
BLOCK_SIZES = (32, 64, 128, 256, 512, 768, 1024)  # llm.c's sweep, including 768
SIM_NUM_SMS = DEVICE_SMS        # the emulator's stand-in device (sim/launcher.py)
SIM_MAX_THREADS_PER_SM = DEVICE_MAX_THREADS_PER_SM
AGGREGATE_THREADS = 1024        # version 4's second kernel: one block of this many threads


def _device_threads() -> int:
    """maxThreadsPerSM * numSMs of the device the kernels run on (cached per device by the backend)."""
    if _backend.is_sim():
        return SIM_NUM_SMS * SIM_MAX_THREADS_PER_SM
    return (_backend.device_attribute("MultiProcessorCount")
            * _backend.device_attribute("MaxThreadsPerMultiProcessor"))


def grid_size(count: int, block_size: int, cap: int | None = None) -> int:
    """Blocks that fill the device exactly once (floor division), at most what count needs, >= 1."""
    grid = _device_threads() // block_size
    grid = min(grid, -(-count // block_size))
    if cap is not None:
        grid = min(grid, cap)
    return max(1, grid)


def reference(data):
    # llm.c's CPU reference: float64 accumulation of the fp32 values, cast to float
    return {"out": np.array([np.sum(data.astype(np.float64).ravel() ** 2)], dtype=np.float32)}


def make_inputs(rng, count):
    # llm.c's harness: uniform in [-1, 1] scaled by 1e-3 (the reference is ~23.6 at the spec size)
    return {"data": (rng.uniform(-1.0, 1.0, size=count) * 1e-3).astype(np.float32)}


def validate(a):
    need(a["data"] is not None, f"{NAME}: data is required")
    check_float32(NAME, data=a["data"])
    need(a["data"].size >= 1, f"{NAME}: data is empty")


def allocate(xp, a):
    return {"out": xp.zeros(1, dtype=np.float32)}


def _kernel(name):
    return kernel_of(NAME, name)


def _launch_atomic(name):
    @kernels_only
    def launch(a, bs):
        count = int(a["data"].size)
        # the kernel only accumulates into out[0]; zeroed by a kernel, not out.fill(0), so a launch
        # plan's replay (and a captured graph) clears it too
        _kernel("global_norm_zero_kernel")((1,), (1,), (a["out"],))
        _kernel(name)((grid_size(count, bs),), (bs,), (a["out"], a["data"], np.int64(count)))

    return launch


@kernels_only
def _launch_v4(a, bs):
    count = int(a["data"].size)
    bs = max(bs, 128)  # llm.c promotes blocks <= 64 to 128 threads
    grid = grid_size(count, bs, cap=AGGREGATE_THREADS)  # the fix: never more partials than 1024
    # scratch, not a fresh array: a graph capture may not allocate (every entry is written by kernel 4)
    partials = scratch(NAME, "partials", grid)
    _kernel("global_norm_kernel4")((grid,), (bs,), (partials, a["data"], np.int64(count)))
    _kernel("global_norm_aggregate_kernel")((1,), (AGGREGATE_THREADS,), (a["out"], partials, np.int32(grid)))


OP = Op(
    name=NAME,
    summary="SQUARED L2 norm sum(x^2) of a flat array (no sqrt; the caller takes it), fp32 accumulation",
    source=SOURCE,
    inputs=("data",),
    outputs=("out",),
    versions={
        1: Version(1, "cg warp reduce -> shared partials -> warp 0 reduce, one atomicAdd per block",
                   _launch_atomic("global_norm_kernel1"), block_sizes=BLOCK_SIZES, deterministic=False),
        2: Version(2, "cg warp reduce, one atomicAdd per warp", _launch_atomic("global_norm_kernel2"),
                   block_sizes=BLOCK_SIZES, deterministic=False),
        3: Version(3, "common block-reduce helper (xor shuffles + 32-float smem), one atomicAdd per block",
                   _launch_atomic("global_norm_kernel3"), block_sizes=BLOCK_SIZES, deterministic=False),
        4: Version(4, "deterministic: per-block partials, then one 1024-thread block sums them (grid <= 1024)",
                   _launch_v4, block_sizes=BLOCK_SIZES),
    },
    default_version=4,
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=validate,
    sizes={"count": (768 * 4 * 768 + 768 * 768) * 2 * 12},  # 70,778,880: GPT-2 small's matmul weights
    sim_sizes={"count": 100_000},
    test_shapes=[{"count": 1}, {"count": 1000}, {"count": 50_001}],
    tolerance={"out": (0.0, 2e-4)},
    tolerance_note=(
        "Purely relative: every term x^2 >= 0, so no cancellation, and fp32 summation of non-negative "
        "terms errs by at most (longest addition chain) * eps relative -- in practice about "
        "sqrt(chain) * eps ~ 1e-5 at the spec size (~260 terms per thread, then trees and a few thousand "
        "atomics). llm.c's fp32 check, 1e-2 + FLT_EPSILON*|ref|, is 4e-4 relative at its reference of "
        "23.6 but vacuous at the emulator's sizes (sums ~1e-3); 2e-4 relative is tighter at every size."
    ),
    sizes_of=lambda a: {"count": int(a["data"].size)},
    bound=Bound("memory", bytes=lambda s: 4 * s["count"]),
    notes=(
        "Returns the squared norm. Default version 4: deterministic and, per llm.c's file, about as fast "
        "as version 3 (the bf16 mainline uses its scheme)."
    ),
)
