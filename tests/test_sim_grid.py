"""Cooperative launches in the emulator: grid.sync() as a barrier of every block, the co-residency
rule, its error paths (a plain launch, too large a grid, a block that never arrives) and racecheck
across grid.sync()."""

import textwrap

import numpy as np
import pytest

import llmcupy
from llmcupy import sim

ORDERS = ("forward", "reverse", "random")

# A single-pass global sum: each block reduces its grid-stride share into partial[block],
# grid.sync(), then block 0 adds the partials. A second phase after another grid.sync() has every
# block read the total block 0 wrote (visibility of a write after the sync to every block) and
# scale its own slice by it.
CODE = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

__global__ void grid_sum(float* partial, float* total, float* scaled, const float* x, int n) {
    cg::grid_group grid = cg::this_grid();
    extern __shared__ float buf[];
    float acc = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) acc += x[i];
    buf[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = buf[0];
    grid.sync();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        float t = 0.0f;
        for (int b = 0; b < gridDim.x; ++b) t += partial[b];
        total[0] = t;
    }
    grid.sync();
    float t = total[0];
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) scaled[i] = x[i] / t;
}

__global__ void valid(int* out) {
    if (threadIdx.x == 0) out[blockIdx.x] = cg::this_grid().is_valid() ? 1 : 2;
}

__global__ void early_return(int* out, int quit) {
    if (blockIdx.x == quit) return;
    cg::this_grid().sync();
    out[blockIdx.x] = 1;
}

__global__ void spin_then_sync(volatile int* flag) {
    if (blockIdx.x == 0)
        while (flag[0] == 0) {}
    cg::this_grid().sync();
}

// A handoff between blocks: every block writes its slot, then (with use_sync) grid.sync(), then block
// 0 reads every slot. Without the sync the reads race with other blocks' writes.
__global__ void handoff(float* slots, float* out, int use_sync) {
    if (threadIdx.x == 0) slots[blockIdx.x] = float(blockIdx.x + 1);
    if (use_sync) cg::this_grid().sync();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        float t = 0.0f;
        for (int b = 0; b < gridDim.x; ++b) t += slots[b];
        out[0] = t;
    }
}

// Rounds of write, sync, read a neighbour's slot; the second sync of a round keeps the next round's
// write after this round's read (without it: a write-after-read race between blocks).
__global__ void rounds(float* slots, float* out, int second_sync) {
    cg::grid_group g = cg::this_grid();
    for (int r = 0; r < 3; ++r) {
        if (threadIdx.x == 0) slots[blockIdx.x] = float(blockIdx.x * 10 + r);
        g.sync();
        if (threadIdx.x == 0) out[r * gridDim.x + blockIdx.x] = slots[(blockIdx.x + 1) % gridDim.x];
        if (second_sync) g.sync();
    }
}
"""


# Kept out of CODE, which the GPU twin also builds: on a GPU this kernel's failed assert would poison
# the CUDA context of the test process; it only matters to the emulator's error path.
ASSERT_CODE = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
__global__ void assert_then_sync(int* out) {
    assert(blockIdx.x != 2);
    cg::this_grid().sync();
    out[blockIdx.x] = 1;
}
"""


def cooperative(target="sim"):
    return llmcupy.RawModule(code=textwrap.dedent(CODE), target=target, enable_cooperative_groups=True)


def plain():
    return llmcupy.RawModule(code=textwrap.dedent(CODE), target="sim")


def run_grid_sum(mod, blocks, threads, x, xp=np):
    n = x.size
    partial = xp.zeros(blocks, xp.float32)
    total = xp.zeros(1, xp.float32)
    scaled = xp.zeros(n, xp.float32)
    mod.get_function("grid_sum")((blocks,), (threads,), (partial, total, scaled, x, np.int32(n)),
                                 shared_mem=threads * 4)
    return partial, total, scaled


def check_grid_sum(x, blocks, threads, partial, total, scaled):
    x64 = x.astype(np.float64)
    # each block's grid-stride share: element i belongs to block (i // threads) % blocks
    shares = np.bincount((np.arange(x.size) // threads) % blocks, weights=x64, minlength=blocks)
    # float32 sums of at most ~10^4 values in [0, 1) in a different order than float64's: the
    # relative error stays below n * eps32 ~ 1e-3 in the worst case, ~1e-6 typically; 1e-5 is far
    # above the observed and far below a missing or doubled partial (>= 1e-2 here)
    np.testing.assert_allclose(partial, shares, rtol=1e-5)
    np.testing.assert_allclose(total[0], x64.sum(), rtol=1e-5)
    # scaled is x / total with total read after the second grid.sync(): exact division of the same floats
    np.testing.assert_array_equal(scaled, x / total[0])


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("blocks,threads", [(4, 64), (16, 128), (4, 1024)])
@pytest.mark.parametrize("workers", [1, 3])
def test_grid_sync_reduction_matches_numpy(order, blocks, threads, workers, no_hazards):
    """The workers setting does not apply to a cooperative launch: every block runs at once, so
    one worker (which would otherwise run the blocks one after another and hang at grid.sync) works."""
    x = np.random.default_rng(blocks * threads).random(10007, dtype=np.float32)
    with sim.settings(order=order, seed=7, workers=workers):
        partial, total, scaled = run_grid_sum(cooperative(), blocks, threads, x)
    check_grid_sum(x, blocks, threads, partial, total, scaled)


def test_raw_kernel_takes_the_flag_as_cupy_does(no_hazards):
    k = llmcupy.RawKernel(textwrap.dedent(CODE), "grid_sum", enable_cooperative_groups=True)
    assert k.enable_cooperative_groups and k.module.enable_cooperative_groups
    x = np.random.default_rng(0).random(4096, dtype=np.float32)
    partial, total, scaled = np.zeros(8, np.float32), np.zeros(1, np.float32), np.zeros_like(x)
    k((8,), (256,), (partial, total, scaled, x, np.int32(x.size)), shared_mem=1024)
    check_grid_sum(x, 8, 256, partial, total, scaled)


def test_is_valid_only_in_a_cooperative_launch(no_hazards):
    out = np.zeros(4, np.int32)
    plain().get_function("valid")((4,), (32,), (out,))
    assert (out == 2).all()
    cooperative().get_function("valid")((4,), (32,), (out,))
    assert (out == 1).all()


def test_grid_sync_without_a_cooperative_launch_is_a_clear_error():
    x = np.ones(256, np.float32)
    with pytest.raises(sim.SimLaunchError, match=r"grid_sum calls grid_group::sync\(\) \(line \d+, block .*outside a "
                                                 r"cooperative launch.*enable_cooperative_groups=True"):
        run_grid_sum(plain(), 2, 64, x)


@pytest.mark.parametrize("blocks,threads,limit", [(65, 32, 64), (65, 64, 64), (33, 128, 32), (5, 1024, 4),
                                                  (9, 600, 6)])
def test_too_large_a_cooperative_grid_is_refused_before_it_runs(blocks, threads, limit):
    """2 SMs x min(32 blocks, 2048 threads in whole warps) per SM: 600 threads take 19 warps, 3 per SM."""
    out = np.full(blocks, 7, np.int32)
    k = cooperative().get_function("early_return")
    with pytest.raises(sim.SimCooperativeLaunchTooLargeError,
                       match=rf"early_return: a cooperative launch of grid \({blocks}, 1, 1\) \({blocks} blocks of "
                             rf"{threads} threads\) does not fit .* at most {limit} blocks .*"
                             r"cudaErrorCooperativeLaunchTooLarge"):
        k((blocks,), (threads,), (out, np.int32(-1)))
    assert (out == 7).all()   # nothing ran
    k((limit,), (threads,), (out, np.int32(-1)))   # the largest grid that fits runs
    assert (out[:limit] == 1).all()
    assert sim.launcher.cooperative_block_limit(threads) == limit


@pytest.mark.parametrize("order", ORDERS)
def test_a_block_that_returns_while_others_wait_is_a_deadlock(order):
    out = np.zeros(8, np.int32)
    k = cooperative().get_function("early_return")
    with sim.settings(order=order, timeout=60):
        with pytest.raises(sim.SimDeadlockError, match=r"deadlock in kernel early_return: 7 block\(s\).* wait at "
                                                       r"grid\.sync\(\) \(line \d+\) for 1 block\(s\) that returned "
                                                       r"without reaching it \(block \(3,0,0\) the first\)"):
            k((8,), (32,), (out, np.int32(3)))
        k((8,), (32,), (out, np.int32(-1)))   # the library runs again after the failed launch
    assert (out == 1).all()


def test_the_watchdog_stops_blocks_waiting_at_grid_sync():
    flag = np.zeros(1, np.int32)
    with sim.settings(timeout=1):
        with pytest.raises(sim.SimTimeoutError, match=r"spin_then_sync ran past the emulator's time limit"):
            cooperative().get_function("spin_then_sync")((4,), (32,), (flag,))
    flag[0] = 1
    cooperative().get_function("spin_then_sync")((4,), (32,), (flag,))


def test_a_failing_block_releases_the_blocks_waiting_at_grid_sync():
    out = np.zeros(4, np.int32)
    with pytest.raises(sim.SimDeviceAssertError, match=r"assert_then_sync.*block \(2,0,0\)"):
        llmcupy.RawModule(code=ASSERT_CODE, target="sim", enable_cooperative_groups=True).get_function(
            "assert_then_sync")((4,), (32,), (out,))


@pytest.mark.parametrize("order", ORDERS)
def test_racecheck_is_clean_across_grid_sync(order, no_hazards):
    slots, out = np.zeros(8, np.float32), np.zeros(24, np.float32)
    mod = cooperative()
    with sim.settings(check="all", order=order):
        mod.get_function("handoff")((8,), (32,), (slots, out, np.int32(1)))
        assert out[0] == 36
        mod.get_function("rounds")((8,), (32,), (slots, out, np.int32(1)))
        x = np.random.default_rng(1).random(3000, dtype=np.float32)
        partial, total, scaled = run_grid_sum(mod, 4, 128, x)
    b = np.arange(8)
    assert (out.reshape(3, 8) == ((b + 1) % 8) * 10 + np.arange(3)[:, None]).all()
    check_grid_sum(x, 4, 128, partial, total, scaled)


@pytest.mark.parametrize("order", ORDERS)
def test_racecheck_flags_the_same_handoff_without_grid_sync(order):
    slots, out = np.zeros(8, np.float32), np.zeros(24, np.float32)
    mod = cooperative()
    with sim.settings(check="race", order=order):
        with pytest.raises(sim.SimSanitizerError) as err:
            mod.get_function("handoff")((8,), (32,), (slots, out, np.int32(0)))
    races = [r for r in err.value.reports if r.between_blocks]
    assert races and all(r.kind in ("RAW", "WAR") and r.where == "argument 0" for r in races)
    assert all(r.block == (0, 0, 0) or r.prev_block == (0, 0, 0) for r in races)
    # a race after a grid.sync() is still one: the next round's write against this round's read
    with sim.settings(check="race", order=order):
        with pytest.raises(sim.SimSanitizerError, match=r"WAR hazard on global memory \(argument 0\) in kernel rounds "
                                                        r"between blocks"):
            mod.get_function("rounds")((8,), (32,), (slots, out, np.int32(0)))


@pytest.mark.gpu
def test_grid_sync_reduction_on_the_gpu():
    """Run on a GPU: the same cooperative launch through CuPy (cuLaunchCooperativeKernel) gives the
    same sums as NumPy, and is_valid() is true there."""
    import cupy

    x = np.random.default_rng(3).random(100003, dtype=np.float32)
    mod = cooperative("cuda")
    for blocks, threads in [(4, 64), (16, 128), (8, 1024)]:
        partial, total, scaled = run_grid_sum(mod, blocks, threads, cupy.asarray(x), xp=cupy)
        check_grid_sum(x, blocks, threads, cupy.asnumpy(partial), cupy.asnumpy(total), cupy.asnumpy(scaled))
    out = cupy.zeros(4, cupy.int32)
    mod.get_function("valid")((4,), (32,), (out,))
    assert (cupy.asnumpy(out) == 1).all()


def test_readme_cooperative_example_runs(no_hazards):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r"```python\n(mod = llmcupy\.RawModule\(code=r'''\n#include <cooperative_groups.h>.*?)```", text,
                      re.S)
    assert block, "the README's cooperative launch example is missing"
    namespace = {"np": np, "llmcupy": llmcupy, "xp": np}
    exec(compile(block.group(1), "README.md", "exec"), namespace)
    assert namespace["out"][0] == 499500   # integers below 2**24: exact in float32 in any order
