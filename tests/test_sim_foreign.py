"""Kernels written the way people outside this project write CUDA (tutorials, NVIDIA's blog and
samples, warp-synchronous legacy code, CAS loops), run in the emulator in three thread orders.

Each one gives CUDA's answer, or a clear Python error where CUDA fails the launch; a kernel that
could hang runs in a forked child with a time limit, so a regression fails the test instead of
stalling the run.
"""

import multiprocessing
import re
import textwrap

import numpy as np
import pytest

import llmcupy
from llmcupy import sim
from llmcupy.runtime import LaunchBoundsError

ORDERS = ("forward", "reverse", "random")


def module(code, **kw):
    return llmcupy.RawModule(code=textwrap.dedent(code), target="sim", **kw)


def _child(queue, fn, args):
    try:
        queue.put(("ok", fn(*args)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        queue.put(("error", f"{type(exc).__name__}: {exc}"))


def in_child(fn, *args, timeout=120):
    """Runs ``fn(*args)`` in a forked child; a hang fails by timeout instead of stalling pytest."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, fn, args))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        pytest.fail(f"{fn.__name__} did not finish within {timeout} s (a hang)")
    assert not queue.empty(), f"{fn.__name__}: the child died with exit code {proc.exitcode}"
    return queue.get()


# ---------------------------------------------------------------------------------------------
# Sub-warp collectives followed by a wider one (a released group must wait at the same collective)
# ---------------------------------------------------------------------------------------------

SUBWARP = r"""
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;
template <int N>
__global__ void tile_then_full(const int* in, int* out) {
    int t = threadIdx.x, v = in[t];
    auto tile = cg::tiled_partition<N>(cg::this_thread_block());
    out[64 + t] = cg::reduce(tile, v, cg::plus<int>());
    out[t] = __shfl_up_sync(0xffffffffu, v, 1);
    out[32 + t] = __shfl_down_sync(0xffffffffu, v, 3);
    out[96 + t] = (int)__ballot_sync(0xffffffffu, v > 2);
    auto warp = cg::tiled_partition<32>(cg::this_thread_block());
    out[128 + t] = warp.shfl(v, (t + 5) % 32);
}
__global__ void half_masks(const int* in, int* out) {
    int t = threadIdx.x, v = in[t];
    unsigned half = t < 16 ? 0x0000ffffu : 0xffff0000u;
    int s = v;
    for (int o = 8; o > 0; o /= 2) s += __shfl_xor_sync(half, s, o, 16);
    out[t] = s;
    out[32 + t] = __shfl_up_sync(0xffffffffu, v, 1);
    out[64 + t] = (int)__ballot_sync(0xffffffffu, (v & 1) != 0);
}
__global__ void branches(const int* in, int* out) {
    int t = threadIdx.x, v = in[t], r;
    if (t & 1) r = __shfl_xor_sync(0xaaaaaaaau, v, 2);
    else r = __shfl_xor_sync(0x55555555u, v, 2) + 1000;
    out[t] = r;
    out[32 + t] = __shfl_down_sync(0xffffffffu, v, 1);
}
"""


def _shfl_up(v, d):
    lanes = np.arange(32)
    return np.where(lanes >= d, v[np.maximum(lanes - d, 0)], v)


def _shfl_down(v, d):
    lanes = np.arange(32)
    return np.where(lanes + d < 32, v[np.minimum(lanes + d, 31)], v)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("tile", [4, 8, 16])
def test_tile_collective_then_full_warp(order, tile, no_hazards):
    mod = module(SUBWARP, name_expressions=[f"tile_then_full<{tile}>"])
    v = np.random.default_rng(tile).integers(0, 6, 32).astype(np.int32)
    out = np.zeros(160, np.int32)
    with sim.settings(order=order, seed=tile):
        mod.get_function(f"tile_then_full<{tile}>")((1,), (32,), (v, out))
    assert (out[:32] == _shfl_up(v, 1)).all()  # lane 16 gets lane 15's value
    assert (out[32:64] == _shfl_down(v, 3)).all()
    assert (out[64:96] == np.repeat(v.reshape(-1, tile).sum(1), tile)).all()
    ballot = sum(1 << i for i in range(32) if v[i] > 2)
    assert (out[96:128].view(np.uint32) == ballot).all()
    assert (out[128:] == v[(np.arange(32) + 5) % 32]).all()


@pytest.mark.parametrize("order", ORDERS)
def test_half_warp_masks_then_full_warp(order, no_hazards):
    mod = module(SUBWARP)
    v = np.arange(32, dtype=np.int32) * 3 + 1
    out = np.zeros(96, np.int32)
    with sim.settings(order=order, seed=5):
        mod.get_function("half_masks")((1,), (32,), (v, out))
    assert (out[:32] == np.repeat(v.reshape(2, 16).sum(1), 16)).all()
    assert (out[32:64] == _shfl_up(v, 1)).all()
    assert (out[64:].view(np.uint32) == sum(1 << i for i in range(32) if v[i] & 1)).all()


@pytest.mark.parametrize("order", ORDERS)
def test_disjoint_branch_masks_then_full_warp(order, no_hazards):
    mod = module(SUBWARP)
    v = np.arange(32, dtype=np.int32) * 7
    out = np.zeros(64, np.int32)
    with sim.settings(order=order, seed=9):
        mod.get_function("branches")((1,), (32,), (v, out))
    lanes = np.arange(32)
    assert (out[:32] == v[lanes ^ 2] + np.where(lanes & 1, 0, 1000)).all()
    assert (out[32:] == _shfl_down(v, 1)).all()


# ---------------------------------------------------------------------------------------------
# static __shared__, __activemask, legacy volatile warp-synchronous code
# ---------------------------------------------------------------------------------------------

BLOG = r"""
// NVIDIA blog "Faster Parallel Reductions on Kepler" style: a static __shared__ array in a helper
__inline__ __device__ float warpReduceSum(float val) {
    for (int offset = warpSize / 2; offset > 0; offset /= 2) val += __shfl_down_sync(0xffffffff, val, offset);
    return val;
}
__inline__ __device__ float blockReduceSum(float val) {
    static __shared__ float shared[32];
    int lane = threadIdx.x % warpSize, wid = threadIdx.x / warpSize;
    val = warpReduceSum(val);
    if (lane == 0) shared[wid] = val;
    __syncthreads();
    val = (threadIdx.x < blockDim.x / warpSize) ? shared[lane] : 0;
    if (wid == 0) val = warpReduceSum(val);
    return val;
}
__global__ void block_sums(const float* in, float* out) {
    float s = blockReduceSum(in[blockIdx.x * blockDim.x + threadIdx.x]);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}
__global__ void odd_lanes(unsigned* out) {
    unsigned m = 0;
    if (threadIdx.x & 1) m = __activemask();
    out[threadIdx.x] = m;
}
// warp-aggregated atomics (NVIDIA blog): one atomicAdd per warp for the lanes that take the branch
__device__ int atomicAggInc(int* ctr) {
    unsigned active = __activemask();
    int leader = __ffs(active) - 1;
    int change = __popc(active);
    unsigned rank = __popc(active & ((1u << (threadIdx.x % 32)) - 1));
    int warp_res;
    if (threadIdx.x % 32 == leader) warp_res = atomicAdd(ctr, change);
    warp_res = __shfl_sync(active, warp_res, leader);
    return warp_res + rank;
}
__global__ void filter(const int* in, int* out, int* count, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && in[i] > 0) out[atomicAggInc(count)] = in[i];
}
// the classic reduce6: the last warp unrolled on a volatile pointer, no __syncwarp
template <unsigned blockSize>
__device__ void warpReduce(volatile float* sdata, unsigned tid) {
    if (blockSize >= 64) sdata[tid] += sdata[tid + 32];
    if (blockSize >= 32) sdata[tid] += sdata[tid + 16];
    if (blockSize >= 16) sdata[tid] += sdata[tid + 8];
    if (blockSize >= 8) sdata[tid] += sdata[tid + 4];
    if (blockSize >= 4) sdata[tid] += sdata[tid + 2];
    if (blockSize >= 2) sdata[tid] += sdata[tid + 1];
}
__global__ void reduce6(const float* g_idata, float* g_odata, unsigned n) {
    __shared__ float sdata[256];
    unsigned tid = threadIdx.x, i = blockIdx.x * 512 + tid, gridSize = 512 * gridDim.x;
    sdata[tid] = 0;
    while (i < n) { sdata[tid] += g_idata[i] + g_idata[i + 256]; i += gridSize; }
    __syncthreads();
    if (tid < 128) { sdata[tid] += sdata[tid + 128]; } __syncthreads();
    if (tid < 64) { sdata[tid] += sdata[tid + 64]; } __syncthreads();
    if (tid < 32) warpReduce<256>(sdata, tid);
    if (tid == 0) g_odata[blockIdx.x] = sdata[0];
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_static_shared_in_a_device_helper_is_per_block(order, no_hazards):
    x = np.random.default_rng(1).random(2000 * 256, dtype=np.float32)
    out = np.zeros(2000, np.float32)
    with sim.settings(order=order, workers=2):
        module(BLOG).get_function("block_sums")((2000,), (256,), (x, out))
    np.testing.assert_allclose(out, x.reshape(2000, 256).sum(1, dtype=np.float64), rtol=1e-5)


@pytest.mark.parametrize("order", ORDERS)
def test_activemask_is_the_converged_lanes(order, no_hazards):
    out = np.zeros(64, np.uint32)
    with sim.settings(order=order):
        module(BLOG).get_function("odd_lanes")((1,), (64,), (out,))
    assert (out[1::2] == 0xAAAAAAAA).all() and (out[0::2] == 0).all()


@pytest.mark.parametrize("order", ORDERS)
def test_warp_aggregated_atomics(order, no_hazards):
    x = np.random.default_rng(2).integers(-5, 5, 5000).astype(np.int32)
    out = np.zeros(5000, np.int32)
    count = np.zeros(1, np.int32)
    with sim.settings(order=order):
        module(BLOG).get_function("filter")((20,), (256,), (x, out, count, np.int32(5000)))
    positive = x[x > 0]
    assert count[0] == positive.size
    assert sorted(out[:count[0]]) == sorted(positive)


@pytest.mark.parametrize("order", ORDERS)
def test_legacy_volatile_warp_synchronous_reduction(order, no_hazards):
    n = 8 * 512 * 4
    x = np.random.default_rng(3).random(n, dtype=np.float32)
    out = np.zeros(8, np.float32)
    with sim.settings(order=order):
        module(BLOG).get_function("reduce6")((8,), (256,), (x, out, np.uint32(n)))
    np.testing.assert_allclose(out.sum(), x.sum(dtype=np.float64), rtol=1e-5)
    expect = [x[np.concatenate([np.arange(b * 512 + k * 4096, b * 512 + k * 4096 + 512) for k in range(4)])].sum()
              for b in range(8)]
    np.testing.assert_allclose(out, expect, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# Crashes and hangs become Python errors
# ---------------------------------------------------------------------------------------------

FAILING = r"""
// assert() is built in, as under NVRTC (which has no <assert.h>)
__global__ void checked(const int* x, int* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    assert(x[i] < n);
    y[i] = x[i];
}
__global__ void flag_wait(int* out) {
    __shared__ volatile int flag;
    if (threadIdx.x == 0) flag = 0;
    __syncthreads();
    if (threadIdx.x == 32) { out[1] = 7; flag = 1; }      // warp 1 sets the flag
    if (threadIdx.x == 0) { while (flag == 0) { } out[0] = out[1] + 35; }   // warp 0 waits for it
}
__global__ void spin_lock(int* out) {
    __shared__ int mutex, total;
    if (threadIdx.x == 0) { mutex = 0; total = 0; }
    __syncthreads();
    while (atomicCAS(&mutex, 0, 1) != 0) { }
    total += 1;
    __threadfence_block();
    atomicExch(&mutex, 0);
    __syncthreads();
    if (threadIdx.x == 0) out[0] = total;
}
__global__ void never_set(int* out) {
    __shared__ int ready;
    if (threadIdx.x == 0) ready = 0;
    __syncthreads();
    if (threadIdx.x == 3) while (ready == 0) { out[0]++; }
}
__global__ void volatile_never_set(int* out, volatile int* flag) {
    if (threadIdx.x == 0) while (*flag == 0) { }
    out[0] = 1;
}
__global__ void big_local(float* out) {
    float scratch[24 * 1024];   // 96 KiB of local memory per thread
    for (int i = 0; i < 24 * 1024; i++) scratch[i] = (float)(i + threadIdx.x);
    out[blockIdx.x * blockDim.x + threadIdx.x] = scratch[threadIdx.x * 7 + 5] + scratch[24 * 1024 - 1];
}
__global__ void delay(long long* out) {
    long long start = clock64();
    while (clock64() - start < 10000) { }
    long long t1 = clock64();
    int c0 = clock();
    out[threadIdx.x] = t1 - start;
    out[32 + threadIdx.x] = clock() - c0 >= 0;
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_failing_device_assert_is_an_exception_and_the_process_lives(order):
    mod = module(FAILING, filename="checked.cu")
    x = np.arange(64, dtype=np.int32)
    y = np.zeros(64, np.int32)
    with sim.settings(order=order), pytest.raises(sim.SimDeviceAssertError) as info:
        mod.get_function("checked")((2,), (32,), (x, y, np.int32(40)))
    text = str(info.value)
    assert "kernel checked" in text and "`x[i] < n`" in text and "checked.cu:5" in text
    assert "block (1,0,0)" in text and "thread (" in text
    # the process and the emulator carry on
    mod.get_function("checked")((2,), (32,), (x, y, np.int32(100)))
    assert (y == x).all()


def test_the_same_source_under_another_filename_names_that_file():
    # the emulator's in-process library cache keyed on the source, not the file name: a second
    # RawModule of the same code as other.cu ran the first one's library, whose asserts and faults
    # said first.cu (and the test above failed whenever a test compiling FAILING as kernel.cu ran first)
    code = "// assert() needs no header (NVRTC refuses <assert.h>)\n__global__ void positive(const int* x) { assert(x[threadIdx.x] > 0); }\n"
    for name in ("first.cu", "other.cu"):
        with pytest.raises(sim.SimDeviceAssertError, match=rf"at {re.escape(name)}:2, "):
            module(code, filename=name).get_function("positive")((1,), (1,), (np.zeros(1, np.int32),))


def _flag_wait(order):
    out = np.zeros(2, np.int32)
    with sim.settings(order=order, timeout=60):
        module(FAILING).get_function("flag_wait")((1,), (64,), (out,))
    return out.tolist()


def _spin_lock(order):
    out = np.zeros(1, np.int32)
    with sim.settings(order=order, timeout=60):
        module(FAILING).get_function("spin_lock")((1,), (128,), (out,))
    return out.tolist()


@pytest.mark.parametrize("order", ORDERS)
def test_spin_wait_between_warps_makes_progress(order):
    module(FAILING)  # compile in the parent: the children find it in the cache
    assert in_child(_flag_wait, order) == ("ok", [42, 7])
    assert in_child(_spin_lock, order) == ("ok", [128])


# CUDA by Example's Lock (appendix A): one thread per block takes a mutex with atomicCAS, adds its
# block's sum to a global total, and releases it with atomicExch. The book's version has no fence
# before the release, so nothing orders one holder's update before the next holder's read (PTX
# atomics are relaxed): racecheck reports it between blocks; with __threadfence() it is clean.
BOOK_LOCK = r"""
__global__ void dot(const float* a, const float* b, float* c, int* mutex, int n, int fence) {
    __shared__ float cache[128];
    int t = threadIdx.x;
    float tmp = 0;
    for (int i = blockIdx.x * blockDim.x + t; i < n; i += blockDim.x * gridDim.x) tmp += a[i] * b[i];
    cache[t] = tmp;
    __syncthreads();
    for (int i = blockDim.x / 2; i; i /= 2) {
        if (t < i) cache[t] += cache[t + i];
        __syncthreads();
    }
    if (t == 0) {
        while (atomicCAS(mutex, 0, 1) != 0) {}
        *c += cache[0];
        if (fence) __threadfence();
        atomicExch(mutex, 0);
    }
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_a_mutex_between_blocks_works_and_racecheck_wants_its_fence(order, no_hazards):
    k = module(BOOK_LOCK).get_function("dot")
    a, b = np.ones(3000, np.float32), np.full(3000, 2.0, np.float32)

    def run(fence, check=""):
        c = np.zeros(1, np.float32)
        with sim.settings(order=order, workers=2, check=check):
            k((8,), (128,), (a, b, c, np.zeros(1, np.int32), np.int32(3000), np.int32(fence)))
        return c[0]

    assert run(fence=0) == run(fence=1) == 6000.0
    assert run(fence=1, check="race") == 6000.0
    with pytest.raises(sim.SimSanitizerError, match=r"between blocks"):
        run(fence=0, check="race")


def _never_set(order):
    # four blocks on two workers: the stuck thread may run on the caller's thread or a pool thread
    with sim.settings(order=order, timeout=1.5, workers=2):
        module(FAILING).get_function("never_set")((4,), (64,), (np.zeros(1, np.int32),))
    return "finished"


@pytest.mark.parametrize("order", ORDERS)
def test_watchdog_stops_a_genuine_hang_and_says_where(order):
    module(FAILING)
    status, text = in_child(_never_set, order, timeout=60)
    assert status == "error" and text.startswith("SimTimeoutError")
    assert "kernel never_set ran past the emulator's time limit of 1.5 s" in text
    line = textwrap.dedent(FAILING).splitlines().index("    if (threadIdx.x == 3) while (ready == 0) { out[0]++; }")
    assert f"thread 3: running, last seen at __syncthreads (line {line})" in text
    assert "spinning on a plain variable never sees another thread's write" in text
    assert "LLMCUPY_SIM_TIMEOUT" in text


def _volatile_never_set():
    # 5 s, not the 1.5 s of the other watchdog tests: the hint needs thread 0 to have polled at least
    # once, and on a loaded two-core CI machine (the suite beside other processes) the launch's worker
    # once did not get that far in 1.5 s
    with sim.settings(timeout=5):
        module(FAILING).get_function("volatile_never_set")((1,), (32,), (np.zeros(1, np.int32), np.zeros(1, np.int32)))
    return "finished"


def test_watchdog_hint_for_a_volatile_flag_never_set():
    """A thread polling a volatile flag does see other threads' writes: the hint says the value it
    waits for never comes, not to declare the flag volatile."""
    module(FAILING)
    status, text = in_child(_volatile_never_set, timeout=60)
    assert status == "error" and text.startswith("SimTimeoutError"), text
    assert "thread 0: last seen at a volatile read" in text
    assert "A thread polling memory (a volatile access, a repeated atomic, __nanosleep) waits for a value no " \
           "running thread writes" in text
    assert "declare the flag volatile" not in text


def test_timeout_setting_is_checked():
    with pytest.raises(ValueError, match="timeout"):
        with sim.settings(timeout=-1):
            pass


@pytest.mark.parametrize("kwargs,message", [
    (dict(order="random", seed="x"), "seed must be an int (the random thread order's seed), got 'x'"),
    (dict(workers=0), "workers must be a whole number of worker threads >= 1, got 0"),
    (dict(workers=2.5), "workers must be a whole number of worker threads >= 1, got 2.5"),
    (dict(poison="no"), "poison must be True or False"),
])
def test_other_settings_are_checked_when_given(kwargs, message):
    # before: accepted, then a bare TypeError/ValueError from the C structure at the next launch
    # ("invalid literal for int() with base 10: 'no'"), or workers=0 silently taken as 1
    with pytest.raises(ValueError, match=re.escape(message)):
        with sim.settings(**kwargs):
            pass
    with sim.settings(order="random", seed=np.int64(3), workers=1, poison=False) as s:
        assert (s.seed, s.workers, s.poison) == (3, 1, False)


@pytest.mark.parametrize("order", ORDERS)
def test_big_local_array_gets_a_big_enough_stack(order, no_hazards):
    out = np.zeros(128, np.float32)
    with sim.settings(order=order):
        mod = module(FAILING)
        assert mod._sim_library.stack_bytes >= 2 * 96 * 1024
        mod.get_function("big_local")((2,), (64,), (out,))
    t = np.tile(np.arange(64), 2)
    assert (out == (t * 7 + 5 + t) + (24 * 1024 - 1 + t)).all()


@pytest.mark.parametrize("order", ORDERS)
def test_clocks_advance(order, no_hazards):
    out = np.zeros(64, np.int64)
    with sim.settings(order=order):
        module(FAILING).get_function("delay")((1,), (32,), (out,))
    assert (out[:32] >= 10000).all() and (out[32:] == 1).all()


# ---------------------------------------------------------------------------------------------
# Shared-memory bounds, file-scope extern __shared__
# ---------------------------------------------------------------------------------------------

SHARED = r"""
extern __shared__ float buffer[];      // file scope, used by two kernels (older samples)
__global__ void rotate(float* out) {
    buffer[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = buffer[(threadIdx.x + 1) % blockDim.x];
}
__global__ void reverse(float* out) {
    float4* quads = (float4*)buffer;
    buffer[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = buffer[blockDim.x - 1 - threadIdx.x] + quads[0].y;
}
__shared__ int file_counter;           // file-scope static shared
__global__ void count(int* out) {
    if (threadIdx.x == 0) file_counter = 0;
    __syncthreads();
    atomicAdd(&file_counter, 1);
    __syncthreads();
    if (threadIdx.x == 0) out[blockIdx.x] = file_counter;
}
template <typename T>
__global__ void typed(T* out) {
    extern __shared__ __align__(sizeof(T)) unsigned char smem_raw[];
    T* smem = reinterpret_cast<T*>(smem_raw);
    smem[threadIdx.x] = (T)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = smem[blockDim.x - 1 - threadIdx.x];
}
__global__ void off_by_one(float* out, int n) {
    __shared__ float tile[64];
    tile[threadIdx.x] = 1.0f;            // launched with 65 threads
    __syncthreads();
    if (threadIdx.x < n) out[threadIdx.x] = tile[threadIdx.x];
}
__global__ void dynamic_overrun(float* out) {
    buffer[threadIdx.x] = 1.0f;          // shared_mem too small for the block
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_file_scope_shared_memory(order, no_hazards):
    mod = module(SHARED, name_expressions=["typed<double>", "typed<short>"])
    out = np.zeros(3 * 64, np.float32)
    with sim.settings(order=order, workers=2):
        mod.get_function("rotate")((3,), (64,), (out,), shared_mem=64 * 4)
        assert (out == np.tile((np.arange(64) + 1) % 64, 3)).all()
        out = np.zeros(64, np.float32)
        mod.get_function("reverse")((1,), (64,), (out,), shared_mem=64 * 4)
        assert (out == 63 - np.arange(64) + 1).all()
        counts = np.zeros(50, np.int32)
        mod.get_function("count")((50,), (96,), (counts,))
        assert (counts == 96).all()
        d = np.zeros(32, np.float64)
        mod.get_function("typed<double>")((1,), (32,), (d,), shared_mem=32 * 8)
        assert (d == 31 - np.arange(32)).all()
        s = np.zeros(32, np.int16)
        mod.get_function("typed<short>")((1,), (32,), (s,), shared_mem=32 * 2)
        assert (s == 31 - np.arange(32)).all()


@pytest.mark.parametrize("order", ORDERS)
def test_shared_memory_overruns_are_reported_at_the_launch(order):
    mod = module(SHARED)
    with sim.settings(order=order), pytest.raises(sim.SimSharedMemoryError, match=r"past the end of shared array 'tile'"):
        mod.get_function("off_by_one")((1,), (65,), (np.zeros(65, np.float32), np.int32(64)))
    with sim.settings(order=order), pytest.raises(sim.SimSharedMemoryError, match=r"dynamic shared memory .*128 bytes"):
        mod.get_function("dynamic_overrun")((1,), (33,), (np.zeros(1, np.float32),), shared_mem=128)
    out = np.zeros(64, np.float32)
    mod.get_function("off_by_one")((1,), (64,), (out, np.int32(64)))  # in bounds: no error
    assert (out == 1).all()


# ---------------------------------------------------------------------------------------------
# Shuffle modes against the PTX ISA's shfl.sync definition, widths 2..32
# ---------------------------------------------------------------------------------------------

SHUFFLES = r"""
__global__ void modes(int* out, int width) {
    int lane = threadIdx.x, v = 100 + lane;
    for (int b = 0; b < 32; ++b) {
        out[(0 * 32 + b) * 32 + lane] = __shfl_sync(0xffffffffu, v, b, width);
        out[(1 * 32 + b) * 32 + lane] = __shfl_up_sync(0xffffffffu, v, b, width);
        out[(2 * 32 + b) * 32 + lane] = __shfl_down_sync(0xffffffffu, v, b, width);
        out[(3 * 32 + b) * 32 + lane] = __shfl_xor_sync(0xffffffffu, v, b, width);
    }
}
"""


def _ptx_shfl(mode, lane, b, width):
    """PTX ISA shfl.sync with CUDA's c operand: ((32 - width) << 8) | (0 for up, else 0x1f)."""
    segmask = (32 - width) & 31
    cval = 0 if mode == "up" else 31
    max_lane = (lane & segmask) | (cval & ~segmask & 31)
    min_lane = lane & segmask
    if mode == "up":
        j, ok = lane - b, lane - b >= max_lane
    elif mode == "down":
        j, ok = lane + b, lane + b <= max_lane
    elif mode == "bfly":
        j, ok = lane ^ b, (lane ^ b) <= max_lane
    else:
        j = min_lane | (b & ~segmask & 31)
        ok = j <= max_lane
    return j if ok else lane


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("width", [2, 4, 8, 16, 32])
def test_shuffle_modes_follow_the_ptx_isa(order, width, no_hazards):
    out = np.zeros(4 * 32 * 32, np.int32)
    with sim.settings(order=order):
        module(SHUFFLES).get_function("modes")((1,), (32,), (out, np.int32(width)))
    out = out.reshape(4, 32, 32)
    for m, mode in enumerate(("idx", "up", "down", "bfly")):
        expect = np.array([[100 + _ptx_shfl(mode, lane, b, width) for lane in range(32)] for b in range(32)])
        assert (out[m] == expect).all(), mode
    if width == 8:  # the programming guide's case: xor 8 on lane 8 reads lane 0 (an earlier group)
        assert out[3, 8, 8] == 100 and out[3, 8, 0] == 100


# ---------------------------------------------------------------------------------------------
# Atomics overloads, intrinsics, numerics, vector types
# ---------------------------------------------------------------------------------------------

ATOMICS = r"""
// the Programming Guide's double-precision atomicAdd through a 64-bit CAS (renamed: CUDA has one)
__device__ double guide_atomic_add(double* address, double val) {
    unsigned long long int* address_as_ull = (unsigned long long int*)address;
    unsigned long long int old = *address_as_ull, assumed;
    do {
        assumed = old;
        old = atomicCAS(address_as_ull, assumed, __double_as_longlong(val + __longlong_as_double(assumed)));
    } while (assumed != old);
    return __longlong_as_double(old);
}
__global__ void mixed(unsigned* u, float* f, unsigned long long* ull, int* i, double* d) {
    atomicAdd(u, 1);                      // unsigned* with an int literal
    atomicAdd(f, 1.0);                    // float* with a double literal
    atomicAdd(ull, 1);
    atomicMax(u + 1, (int)threadIdx.x);
    atomicCAS(u + 2, 0, 1);
    atomicAdd_block(i, 2);
    atomicAdd_system(i + 1, 3);
    atomicMin(i + 2, -(int)threadIdx.x);
    guide_atomic_add(d, 0.5);
    atomicAdd(d + 1, 0.25);
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_atomics_deduce_the_type_from_the_pointer(order, no_hazards):
    u = np.zeros(3, np.uint32)
    f = np.zeros(1, np.float32)
    ull = np.zeros(1, np.uint64)
    i = np.zeros(3, np.int32)
    d = np.zeros(2, np.float64)
    with sim.settings(order=order, workers=2):
        module(ATOMICS).get_function("mixed")((4,), (64,), (u, f, ull, i, d))
    assert u.tolist() == [256, 63, 1] and f[0] == 256 and ull[0] == 256
    assert i.tolist() == [512, 768, -63] and d.tolist() == [128.0, 64.0]


INTRINSICS = r"""
#include <math_constants.h>
#include <cuda/std/cstdint>
#include <vector_types.h>
#include <device_launch_parameters.h>
__global__ void bits(unsigned* o, unsigned long long* o64) {
    o[0] = __brev(0x1u);
    o[1] = __popcll(0xF0F0F0F0F0F0F0F0ull);
    o[2] = __clzll(1ll);
    o[3] = __ffsll(0x100000000ll);
    o[4] = __umulhi(0x80000000u, 6u);
    o[5] = __byte_perm(0x33221100u, 0x77665544u, 0x5140u);
    o[6] = umin(3u, 7u) + umax(3u, 7u) * 10;
    o[7] = __mul24(1000, -3);
    o[8] = __dp4a(0x01020304, 0x01010101, 10);
    unsigned same = __match_any_sync(0xffffffffu, threadIdx.x / 8);
    if (threadIdx.x == 31) o[9] = same;
    o[10] = __reduce_add_sync(0xffffffffu, threadIdx.x);
    o[11] = __reduce_max_sync(0xffffffffu, threadIdx.x);
    int pred;
    o[12] = __match_all_sync(0xffffffffu, 5, &pred) == 0xffffffffu && pred;
    o64[0] = __brevll(1ull);
    o64[1] = (unsigned long long)__double_as_longlong(__dadd_rn(1.0, 1.0));
}
__global__ void numerics(const float* x, int* i, unsigned* u, float* f) {
    int k = threadIdx.x;
    i[4 * k + 0] = __float2int_rn(x[k]);
    i[4 * k + 1] = __float2int_rd(x[k]);
    i[4 * k + 2] = __float2int_ru(x[k]);
    i[4 * k + 3] = __float2int_rz(x[k]);
    u[k] = __float2uint_rn(x[k]);
    f[k] = __saturatef(x[k]);
}
__global__ void maths(float* o) {
    float s, c;
    sincosf(0.5f, &s, &c);
    o[0] = s; o[1] = c;
    o[2] = norm3df(2.0f, 3.0f, 6.0f);
    o[3] = sinpif(0.5f) + cospif(1.0f);
    o[4] = rcbrtf(8.0f);
    o[5] = normcdff(0.0f);
    o[6] = erfinvf(0.5f);
    o[7] = rhypotf(3.0f, 4.0f);
    o[8] = signbit(-0.0f) ? 1.0f : 0.0f;
    o[9] = __fdiv_rn(1.0f, 4.0f) + __frsqrt_rn(4.0f) + __int2float_rn(3) + __uint2float_rn(2u);
    o[10] = CUDART_PI_F;
    o[11] = isinf(CUDART_INF_F) && isnan(CUDART_NAN_F) ? 1.0f : 0.0f;
}
__global__ void vectors(unsigned* o) {
    o[0] = alignof(uchar4); o[1] = sizeof(uchar4); o[2] = alignof(char4); o[3] = alignof(short2);
    o[4] = alignof(double4); o[5] = sizeof(double4); o[6] = alignof(longlong2); o[7] = alignof(float3);
    uchar4 a = make_uchar4(1, 2, 3, 4); short2 b = make_short2(-1, 5); double4 d = make_double4(1, 2, 3, 4);
    longlong2 l = make_longlong2(7, 8);
    o[8] = a.x + a.w + b.y + (unsigned)d.z + (unsigned)l.y;
    o[9] = sizeof(int64_t) + sizeof(uint8_t);
}
__global__ void arch(int* o) {
#if defined(__CUDA_ARCH__) && defined(__CUDACC_RTC__)
    o[0] = __CUDA_ARCH__;
#else
    o[0] = -1;
#endif
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_bit_and_warp_intrinsics(order, no_hazards):
    o = np.zeros(13, np.uint32)
    o64 = np.zeros(2, np.uint64)
    with sim.settings(order=order):
        module(INTRINSICS).get_function("bits")((1,), (32,), (o, o64))
    assert o[:4].tolist() == [0x80000000, 32, 63, 33]
    assert o[4] == 3 and o[5] == 0x55114400 and o[6] == 73
    assert o[7] == np.uint32(np.int32(-3000).view(np.uint32)) and o[8] == 20
    assert o[9] == 0xFF << 24 and o[10] == 496 and o[11] == 31 and o[12] == 1
    assert o64[0] == 1 << 63 and o64[1] == np.array([2.0]).view(np.uint64)[0]


@pytest.mark.parametrize("order", ORDERS)
def test_conversions_follow_ptx_rules(order, no_hazards):
    x = np.array([np.nan, 3e9, -3e9, 2.5, -2.5, 1.7, -1.0, 0.5, np.inf, -np.inf, 0.3, 1.2], np.float32)
    n = x.size
    i = np.zeros(4 * n, np.int32)
    u = np.zeros(n, np.uint32)
    f = np.zeros(n, np.float32)
    with sim.settings(order=order):
        module(INTRINSICS).get_function("numerics")((1,), (n,), (x, i, u, f))
    i = i.reshape(n, 4)
    imax, imin = 2**31 - 1, -(2**31)
    assert i[0].tolist() == [0, 0, 0, 0]                       # NaN -> 0
    assert (i[1] == imax).all() and (i[2] == imin).all()       # saturate
    assert i[3].tolist() == [2, 2, 3, 2] and i[4].tolist() == [-2, -3, -2, -2]
    assert i[8].tolist() == [imax] * 4 and i[9].tolist() == [imin] * 4
    assert u[0] == 0 and u[1] == 3000000000 and u[2] == 0 and u[6] == 0   # unsigned saturates at 0
    assert f[0] == 0 and f[1] == 1 and f[2] == 0 and f[10] == np.float32(0.3) and f[11] == 1


PLAIN_CASTS = r"""
__global__ void plain_casts(const float* x, unsigned* u, int* i, int n) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n) {
        u[k] = (unsigned)x[k];
        i[k] = (int)(x[k] * 0.5f);
    }
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_plain_out_of_range_float_casts_stop_the_launch(order, no_hazards):
    # In range, a plain C cast is the same on both (truncation toward zero)...
    mod = module(PLAIN_CASTS, filename="casts.cu")
    x = np.array([0.0, 1.9, 7.5, -0.5, 4e9], np.float32)
    u = np.zeros(5, np.uint32)
    i = np.zeros(5, np.int32)
    with sim.settings(order=order):
        mod.get_function("plain_casts")((1,), (32,), (x, u, i, np.int32(5)))
    assert u.tolist() == [0, 1, 7, 0, 4000000000] and i.tolist() == [0, 0, 3, 0, 2000000000]
    # ... out of range a GPU saturates (0 for -1.0f, 0 for NaN) and C++ does not: a clear error, not
    # the CPU's value, naming the kernel, line, conversion and thread.
    for bad, k in ((-1.0, 3), (np.nan, 1), (1e10, 4)):
        x = np.zeros(5, np.float32)
        x[k] = bad
        with sim.settings(order=order), pytest.raises(sim.SimLaunchError) as info:
            mod.get_function("plain_casts")((1,), (32,), (x, u, i, np.int32(5)))
        text = str(info.value)
        assert "plain_casts" in text and "casts.cu:5" in text and "'float' to 'unsigned int'" in text
        assert f"thread ({k},0,0)" in text and "__float2uint_rz" in text


def test_math_functions_and_constants(no_hazards):
    o = np.zeros(12, np.float32)
    module(INTRINSICS).get_function("maths")((1,), (1,), (o,))
    expect = [np.sin(0.5), np.cos(0.5), 7.0, 0.0, 0.5, 0.5, 0.4769362762044699, 0.2, 1.0, 0.25 + 0.5 + 3 + 2,
              np.pi, 1.0]
    np.testing.assert_allclose(o, expect, rtol=1e-6, atol=1e-7)


def test_vector_types_have_cudas_layout(no_hazards):
    o = np.zeros(10, np.uint32)
    module(INTRINSICS).get_function("vectors")((1,), (1,), (o,))
    assert o[:8].tolist() == [4, 4, 4, 4, 16, 32, 16, 4]
    assert o[8] == 1 + 4 + 5 + 3 + 8 and o[9] == 9


def test_cuda_arch_is_defined_as_under_nvrtc(no_hazards):
    o = np.zeros(1, np.int32)
    module(INTRINSICS).get_function("arch")((1,), (1,), (o,))
    assert o[0] == 800
    module(INTRINSICS, options=("-arch=sm_90",)).get_function("arch")((1,), (1,), (o,))
    assert o[0] == 900
    module(INTRINSICS, options=("--gpu-architecture=compute_75",)).get_function("arch")((1,), (1,), (o,))
    assert o[0] == 750


# ---------------------------------------------------------------------------------------------
# Cooperative groups additions
# ---------------------------------------------------------------------------------------------

CG = r"""
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cooperative_groups/scan.h>
namespace cg = cooperative_groups;
__global__ void groups(int* out) {
    int t = threadIdx.x;
    auto block = cg::this_thread_block();
    auto tile = cg::tiled_partition<8>(block);
    out[t] = cg::inclusive_scan(tile, t);
    out[32 + t] = cg::exclusive_scan(tile, 1, cg::plus<int>());
    if (t % 3 == 0) {
        cg::coalesced_group active = cg::coalesced_threads();
        out[64 + t] = active.thread_rank() * 100 + active.size();
        out[96 + t] = cg::reduce(active, t, cg::plus<int>());
        out[128 + t] = active.shfl(t, 0) + active.ballot(t % 2 == 0);
    }
    auto parity = cg::labeled_partition(tile, t % 2);
    out[160 + t] = parity.size() * 100 + parity.thread_rank();
    auto low = cg::binary_partition(tile, (t % 8) < 3);
    out[192 + t] = low.size();
    cg::thread_group quad = cg::tiled_partition(block, 4);
    out[224 + t] = quad.thread_rank() + 10 * quad.meta_group_rank();
    quad.sync();
    cg::invoke_one(tile, [&] { out[256 + t] = 1; });
}
__global__ void grid_wide(int* out) {
    cg::grid_group grid = cg::this_grid();
    out[grid.thread_rank()] = 1;
    grid.sync();
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_cooperative_groups_additions(order, no_hazards):
    out = np.zeros(288, np.int32)
    with sim.settings(order=order):
        module(CG).get_function("groups")((1,), (32,), (out,))
    t = np.arange(32)
    base = t - t % 8
    assert (out[:32] == np.array([sum(range(b, k + 1)) for k, b in zip(t, base)])).all()
    assert (out[32:64] == t % 8).all()
    lanes = t[t % 3 == 0]
    assert (out[64:96][lanes] == np.arange(lanes.size) * 100 + lanes.size).all()
    assert (out[96:128][lanes] == lanes.sum()).all()
    ballot = sum(1 << r for r, lane in enumerate(lanes) if lane % 2 == 0)
    assert (out[128:160][lanes] == ballot).all()
    assert (out[160:192] == 400 + (t % 8) // 2).all()
    assert (out[192:224] == np.where(t % 8 < 3, 3, 5)).all()
    assert (out[224:256] == t % 4 + 10 * (t // 4)).all()
    assert (out[256:288] == (t % 8 == 0)).all()


def test_grid_sync_is_refused_clearly():
    with pytest.raises(sim.SimLaunchError, match=r"grid_group::sync\(\).*cooperative launch"):
        module(CG).get_function("grid_wide")((2,), (32,), (np.zeros(64, np.int32),))


# ---------------------------------------------------------------------------------------------
# Namespaces, get_global, inline PTX
# ---------------------------------------------------------------------------------------------

MODULE = r"""
__constant__ float coef[4];
__device__ int launches;
namespace ops {
__constant__ float gain = 3.0f;
__global__ void scale(float* y, const float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = gain * coef[i % 4] * x[i];
    if (i == 0) atomicAdd(&launches, 1);
}
namespace detail {
template <typename T> __global__ void twice(T* y) { y[threadIdx.x] *= (T)2; }
}
}
__global__ void ptx(unsigned* out, const float* in) {
    unsigned lane, warp, sm;
    float v;
    long long t0;
    asm("mov.u32 %0, %%laneid;" : "=r"(lane));
    asm volatile("mov.u32 %0, %%warpid;" : "=r"(warp));
    asm("mov.u32 %0, %%smid;" : "=r"(sm));
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t0));
    asm("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(in + threadIdx.x));
    asm volatile("membar.gl;" ::: "memory");
    out[threadIdx.x] = lane + 100 * warp + 10000 * (unsigned)v + sm + (t0 > 0 ? 0 : 1000000);
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_namespaced_kernels_and_get_global(order, no_hazards):
    mod = module(MODULE, name_expressions=["ops::scale", "ops::detail::twice<float>"])
    assert "ops::scale" in mod.kernel_names and set(mod.variable_names) == {"coef", "launches", "ops::gain"}
    # one library per source and process: RawModules of the same code share its variables
    mod.global_array("coef", np.float32)[:] = [1, 2, 3, 4]
    mod.global_array("ops::gain", np.float32)[0] = 3.0
    mem = mod.get_global("launches")
    assert mem.size == 4
    mem.memset(0, 4)
    x = np.ones(8, np.float32)
    y = np.zeros(8, np.float32)
    with sim.settings(order=order):
        mod.get_function("ops::scale")((2,), (4,), (y, x, np.int32(8)))
        mod.get_function("ops::detail::twice<float>")((1,), (8,), (y,))
    assert (y == np.tile([6, 12, 18, 24], 2)).all()
    host = np.zeros(1, np.int32)
    mem.copy_to_host(host, 4)
    assert host[0] == 1
    gain = np.array([0.5], np.float32)
    mod.get_global("ops::gain").copy_from_host(gain, 4)
    assert mod.global_array("ops::gain", np.float32)[0] == 0.5
    with pytest.raises(AttributeError, match="no __constant__ or __device__ variable 'nope'"):
        mod.get_global("nope")


@pytest.mark.parametrize("order", ORDERS)
def test_inline_ptx_idioms(order, no_hazards):
    out = np.zeros(64, np.uint32)
    with sim.settings(order=order):
        module(MODULE).get_function("ptx")((1,), (64,), (out, np.arange(64, dtype=np.float32)))
    t = np.arange(64)
    assert (out == t % 32 + 100 * (t // 32) + 10000 * t).all()


def test_unknown_inline_ptx_is_refused_naming_instruction_and_line():
    code = "__global__ void k(int* o) {\n  int x = 0;\n  asm(\"vote.sync.all.pred p, q, 0xffffffff;\" : : \"r\"(x));\n}\n"
    with pytest.raises(sim.SimCompileError) as info:
        llmcupy.RawModule(code=code, target="sim", filename="vote.cu")
    text = str(info.value)
    assert "vote.cu:3" in text and "inline PTX 'vote.sync.all.pred p, q, 0xffffffff' is not supported" in text


# ---------------------------------------------------------------------------------------------
# Headers: cuda_fp16.h, cuda_bf16.h, cuda/std, cupy/complex.cuh, cuComplex.h, curand, CUB
# ---------------------------------------------------------------------------------------------

HEADERS = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda/std/limits>
#include <cuda/std/cstdint>
#include <cuda/std/type_traits>
#include <cupy/complex.cuh>
#include <cuComplex.h>
#include <curand_kernel.h>
#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>
__global__ void halves(const float* x, unsigned short* h, unsigned short* b, float* f, __half* total) {
    int i = threadIdx.x;
    __half a = __float2half(x[i]);
    __nv_bfloat16 c = __float2bfloat16(x[i]);
    h[i] = __half_as_ushort(a);
    b[i] = __bfloat16_as_ushort(c);
    __half2 pair = __floats2half2_rn(1.5f, -2.0f);
    f[i] = __half2float(__hfma(a, __float2half(2.0f), __float2half(1.0f))) * 0 + __low2float(__hmul2(pair, pair))
           + __high2float(pair) + __bfloat162float(c * __float2bfloat16(0.0f));
    atomicAdd(total, __float2half(1.0f));
    __half other = __shfl_xor_sync(0xffffffffu, a, 1);
    if (i == 0) f[32] = __half2float(other);
}
__global__ void std_and_complex(float* out) {
    out[0] = cuda::std::numeric_limits<float>::max();
    out[1] = sizeof(cuda::std::int64_t) + (cuda::std::is_same<cuda::std::uint32_t, unsigned>::value ? 100 : 0);
    complex<float> z(1.0f, 2.0f);
    complex<float> w = z * z + thrust::conj(z);
    out[2] = w.real();
    out[3] = w.imag();
    out[4] = abs(complex<float>(3.0f, 4.0f));
    cuFloatComplex a = make_cuFloatComplex(1.0f, 2.0f), b = make_cuFloatComplex(3.0f, -1.0f);
    cuFloatComplex c = cuCdivf(cuCmulf(a, b), b);
    out[5] = cuCrealf(c);
    out[6] = cuCimagf(c);
}
__global__ void random_numbers(float* u, float* n, unsigned* raw, unsigned long long seed) {
    int id = blockIdx.x * blockDim.x + threadIdx.x;
    curandStatePhilox4_32_10_t state;
    curand_init(seed, id, 0, &state);
    raw[id] = curand(&state);
    for (int k = 0; k < 16; ++k) {
        u[id * 16 + k] = curand_uniform(&state);
        n[id * 16 + k] = curand_normal(&state);
    }
    curandState xorwow;
    curand_init(seed, id, 0, &xorwow);
    float v = curand_uniform(&xorwow);
    if (!(v > 0.0f && v <= 1.0f)) u[id * 16] = -1.0f;
}
// CCCL 3 (what CuPy 14 bundles and compiles against on a GPU) removed cub::Max and friends for
// cuda::maximum<>, which CUB's headers bring in (the emulator's too, with either libcu++).
#define LLMCUPY_TEST_MAX cuda::maximum<>{}
__global__ void cub_sums(const float* in, float* block_out, float* warp_out) {
    typedef cub::BlockReduce<float, 128> BlockReduce;
    typedef cub::WarpReduce<float, 16> WarpReduce;
    __shared__ typename BlockReduce::TempStorage temp;
    __shared__ typename WarpReduce::TempStorage warp_temp[8];
    float v = in[blockIdx.x * 128 + threadIdx.x];
    float total = BlockReduce(temp).Sum(v);
    if (threadIdx.x == 0) block_out[blockIdx.x] = total;
    float part = WarpReduce(warp_temp[threadIdx.x / 16]).Reduce(v, LLMCUPY_TEST_MAX);
    if (threadIdx.x % 16 == 0) warp_out[blockIdx.x * 8 + threadIdx.x / 16] = part;
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_fp16_and_bf16_headers(order, no_hazards):
    x = (np.random.default_rng(4).standard_normal(32) * 100).astype(np.float32)
    x[:4] = [np.nan, np.inf, 70000.0, 1e-8]
    h = np.zeros(32, np.uint16)
    b = np.zeros(32, np.uint16)
    f = np.zeros(33, np.float32)
    total = np.zeros(1, np.float16)
    with sim.settings(order=order):
        module(HEADERS).get_function("halves")((1,), (32,), (x, h, b, f, total))
    with np.errstate(over="ignore"):
        assert (h == x.astype(np.float16).view(np.uint16)).all()   # round to nearest even, inf, NaN
    bits = x.view(np.uint32).astype(np.uint64)
    rne = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    assert (b[1:] == rne[1:]).all() and (b[0] & 0x7FC0) == 0x7FC0
    assert (f[3:32] == 2.25 - 2.0).all() and np.isnan(f[:3]).all() and f[32] == np.float16(x[1])  # x * 0: NaN for inf, NaN
    assert total[0] == 32


def test_cuda_std_and_complex_headers(no_hazards):
    out = np.zeros(7, np.float32)
    module(HEADERS).get_function("std_and_complex")((1,), (1,), (out,))
    z = complex(1, 2)
    w = z * z + z.conjugate()
    assert out[0] == np.finfo(np.float32).max and out[1] == 108
    assert out[2] == w.real and out[3] == w.imag and out[4] == 5
    np.testing.assert_allclose(out[5:], [1.0, 2.0], rtol=1e-6)


def _philox(counter, key):
    """Philox 4x32-10 (Salmon et al.) in Python."""
    c, k = list(counter), list(key)
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k[0]) & 0xFFFFFFFF, p1 & 0xFFFFFFFF, ((p0 >> 32) ^ c[3] ^ k[1]) & 0xFFFFFFFF,
             p0 & 0xFFFFFFFF]
        k = [(k[0] + 0x9E3779B9) & 0xFFFFFFFF, (k[1] + 0xBB67AE85) & 0xFFFFFFFF]
    return c


@pytest.mark.parametrize("order", ORDERS)
def test_curand_philox_and_xorwow(order, no_hazards):
    seed = 1234
    u = np.zeros(64 * 16, np.float32)
    n = np.zeros(64 * 16, np.float32)
    raw = np.zeros(64, np.uint32)
    with sim.settings(order=order):
        module(HEADERS).get_function("random_numbers")((2,), (32,), (u, n, raw, np.uint64(seed)))
    # thread id: subsequence id -> counter (0, 0, id, 0), key = seed; first draw is word 0
    for tid in (0, 1, 63):
        assert raw[tid] == _philox([0, 0, tid, 0], [seed, 0])[0]
    assert (u > 0).all() and (u <= 1).all()
    assert abs(u.mean() - 0.5) < 0.03 and abs(n.mean()) < 0.08 and abs(n.std() - 1) < 0.08


@pytest.mark.parametrize("order", ORDERS)
def test_cub_block_and_warp_reduce(order, no_hazards):
    x = np.random.default_rng(6).random(4 * 128).astype(np.float32)
    block_out = np.zeros(4, np.float32)
    warp_out = np.zeros(32, np.float32)
    with sim.settings(order=order):
        module(HEADERS).get_function("cub_sums")((4,), (128,), (x, block_out, warp_out))
    np.testing.assert_allclose(block_out, x.reshape(4, 128).sum(1), rtol=1e-5)
    assert (warp_out == x.reshape(32, 16).max(1)).all()


def test_the_gpu_tests_cub_kernel_compiles_against_cupys_cccl(have_nvrtc):
    """test_curand_philox_matches_the_gpu compiles all of HEADERS on the GPU, with the CCCL CuPy bundles
    (3.x in CuPy 14), which has no cub::Max: the cub kernel must build there too. NVRTC and CuPy's
    headers from the test extra; skipped without them."""
    from llmcupy import nvrtc

    source = textwrap.dedent(HEADERS)
    cub_part = source[source.index("// CCCL 3"):]
    code = "#include <cub/block/block_reduce.cuh>\n#include <cub/warp/warp_reduce.cuh>\n" + cub_part
    res = nvrtc.compile_source(code, 90, filename="headers_cub.cu")
    assert res.ok, res.log


CUB_UMBRELLA = r"""
#include <cub/cub.cuh>
__global__ void total(const float* x, float* out) {
    using BlockReduce = cub::BlockReduce<float, 64>;
    __shared__ typename BlockReduce::TempStorage temp;
    float sum = BlockReduce(temp).Sum(x[threadIdx.x]);
    if (threadIdx.x == 0) out[0] = sum;
}
"""


def test_cubs_umbrella_header_is_refused_as_nvrtc_refuses_it():
    # before: <cub/cub.cuh> (the include of CUB's examples and of BlockReduce tutorials) compiled in the
    # emulator and the kernel failed to build on the GPU, where it pulls in host code
    with pytest.raises(sim.SimCompileError, match=r"<cub/cub.cuh> does not compile under NVRTC .*include what the "
                                                  r"kernel uses, <cub/block/block_reduce.cuh>"):
        module(CUB_UMBRELLA)
    x, out = np.ones(64, np.float32), np.zeros(1, np.float32)
    module(CUB_UMBRELLA.replace("cub/cub.cuh", "cub/block/block_reduce.cuh")).get_function("total")((1,), (64,), (x, out))
    assert out[0] == 64


def test_cubs_umbrella_header_fails_under_nvrtc(have_nvrtc):
    from llmcupy import nvrtc

    # (the block and warp headers compile: test_the_gpu_tests_cub_kernel_compiles_against_cupys_cccl)
    res = nvrtc.compile_source(textwrap.dedent(CUB_UMBRELLA), 80)
    assert not res.ok and "__host__ function is not allowed in JIT mode" in res.log


@pytest.mark.gpu
def test_curand_philox_matches_the_gpu():
    """Run on a GPU: the emulator's Philox draws equal cuRAND's for the same seed and ids."""
    import cupy

    from llmcupy.runtime.module import _cupy_cuda_include_dir

    headers = _cupy_cuda_include_dir()  # CuPy 14 compiles against this folder (the runtime wheel's, first)
    if headers is not None and not (headers / "curand_kernel.h").is_file():
        pytest.skip(f"CuPy's CUDA headers ({headers}) have no curand_kernel.h: pip install nvidia-curand "
                    "(CUDA 13) or nvidia-curand-cu12 (CUDA 12)")
    outs = {}
    for target in ("cuda", "sim"):
        xp = cupy if target == "cuda" else np
        u = xp.zeros(64 * 16, xp.float32)
        n = xp.zeros(64 * 16, xp.float32)
        raw = xp.zeros(64, xp.uint32)
        mod = llmcupy.RawModule(code=textwrap.dedent(HEADERS), target=target, name_expressions=["random_numbers"])
        mod.get_function("random_numbers")((2,), (32,), (u, n, raw, np.uint64(99)))
        outs[target] = [cupy.asnumpy(a) if target == "cuda" else a for a in (u, n, raw)]
    assert (outs["cuda"][2] == outs["sim"][2]).all()
    np.testing.assert_allclose(outs["cuda"][0], outs["sim"][0], rtol=1e-6)
    np.testing.assert_allclose(outs["cuda"][1], outs["sim"][1], rtol=1e-4, atol=1e-5)


def test_cuda_get_global_is_sized_and_finds_namespaced_variables(monkeypatch):
    """The cuda path of get_global without a GPU: CuPy 14.2's RawModule.get_global wraps the address
    in an UnownedMemory of size 0 (cupy/_core/raw.pyx) and looks up the plain name, so global_array
    could not size its view and ``ops::gain`` (symbol _ZN3ops4gainE) was not found. Ours asks the
    driver for the mangled symbol's address and size; the driver call is faked here."""
    import cupy

    from llmcupy.runtime import module as rt_module

    assert rt_module.mangled_variable_name("coef") == "coef"
    assert rt_module.mangled_variable_name("ops::gain") == "_ZN3ops4gainE"
    assert rt_module.mangled_variable_name("a::bc::d") == "_ZN1a2bc1dE"
    with pytest.raises(AttributeError, match="namespace::name"):
        rt_module.mangled_variable_name("ops::detail::twice<float>")

    symbols = {"coef": (0x7000, 16), "_ZN3ops4gainE": (0x7100, 4)}
    asked = []

    def fake_get_global(handle, symbol):
        asked.append((handle, symbol))
        if symbol not in symbols:
            raise AttributeError("CUDA error 500")
        return symbols[symbol]

    class FakeCupyModule:  # what cupy.RawModule.module returns: a Module with the CUmodule in .ptr
        class module:
            ptr = 0x1234

    monkeypatch.setattr(rt_module, "_cu_module_get_global", fake_get_global)
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    coef = rt_module._cuda_global(FakeCupyModule(), "coef", "m.cu")
    gain = rt_module._cuda_global(FakeCupyModule(), "ops::gain", "m.cu")
    assert (coef.ptr, coef.mem.size, gain.ptr, gain.mem.size) == (0x7000, 16, 0x7100, 4)
    assert asked == [(0x1234, "coef"), (0x1234, "_ZN3ops4gainE")]
    with pytest.raises(AttributeError, match="no __constant__ or __device__ variable 'nope'.*m.cu"):
        rt_module._cuda_global(FakeCupyModule(), "nope", "m.cu")


@pytest.mark.gpu
def test_namespaced_kernels_and_get_global_on_the_gpu():
    """Run on a GPU: the same module API works on the cuda backend."""
    import cupy

    mod = llmcupy.RawModule(code=textwrap.dedent(MODULE), target="cuda",
                            name_expressions=["ops::scale", "ops::detail::twice<float>"])
    # __constant__ tables are set by a copy from the host (as cudaMemcpyToSymbol does): a kernel's
    # store into constant memory (what `[:] =` would launch) is not defined to reach the constant cache
    mod.global_array("coef", np.float32).set(np.array([1, 2, 3, 4], np.float32))
    mod.global_array("ops::gain", np.float32).set(np.array([3.0], np.float32))
    x = cupy.ones(8, cupy.float32)
    y = cupy.zeros(8, cupy.float32)
    mod.get_function("ops::scale")((2,), (4,), (y, x, np.int32(8)))
    mod.get_function("ops::detail::twice<float>")((1,), (8,), (y,))
    assert (cupy.asnumpy(y) == np.tile([6, 12, 18, 24], 2)).all()
    assert mod.get_global("launches").mem.size == 4
    assert mod.global_array("ops::gain", np.float32).shape == (1,)
    with pytest.raises(AttributeError, match="no __constant__ or __device__ variable 'nope'"):
        mod.get_global("nope")


def test_benchmarks_run_without_the_watchdog_limit(monkeypatch):
    from llmcupy import bench
    from llmcupy.sim import launcher

    seen = {}
    monkeypatch.setattr(bench, "_run", lambda *a, **k: seen.setdefault("timeout", launcher._settings.timeout))
    with sim.settings(timeout=30):
        bench.run(["softmax_forward"], progress=False)
        assert seen["timeout"] == 0 and launcher._settings.timeout == 30


def test_asan_mode_reports_out_of_bounds_shared_memory_reads(tmp_path):
    import os
    import subprocess
    import sys

    libasan = subprocess.run(["g++", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(libasan) or not os.path.exists(libasan):
        pytest.skip("g++ has no AddressSanitizer runtime here")
    script = textwrap.dedent("""
        import sys, numpy as np, llmcupy
        code = '''
        extern __shared__ float dyn[];
        __global__ void static_read(float* out) {
            __shared__ float tile[32];
            tile[threadIdx.x] = 1.0f;
            __syncthreads();
            out[threadIdx.x] = tile[threadIdx.x + 1];   // thread 31 reads one past the end
        }
        __global__ void dynamic_read(float* out) {
            dyn[threadIdx.x] = 1.0f;
            __syncthreads();
            out[threadIdx.x] = dyn[threadIdx.x + 1];
        }
        __global__ void fine(float* out) {
            __shared__ float tile[32];
            tile[threadIdx.x] = 2.0f;
            if (threadIdx.x == 0) dyn[0] = 0.0f;
            __syncthreads();
            out[threadIdx.x] = tile[31 - threadIdx.x] + dyn[0];
        }
        '''
        m = llmcupy.RawModule(code=code, target="sim")
        out = np.zeros(32, np.float32)
        m.get_function("fine")((1,), (32,), (out,), shared_mem=4)
        assert (out == 2).all()
        m.get_function(sys.argv[1])((1,), (32,), (out,), shared_mem=128)
    """)
    env = dict(os.environ, LLMCUPY_SIM_ASAN="1", LD_PRELOAD=libasan, ASAN_OPTIONS="detect_leaks=0",
               LLMCUPY_CACHE_DIR=str(tmp_path))
    for kernel in ("static_read", "dynamic_read"):
        proc = subprocess.run([sys.executable, "-c", script, kernel], env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode != 0, kernel
        assert "use-after-poison" in proc.stderr and "READ of size 4" in proc.stderr, kernel


# ---------------------------------------------------------------------------------------------
# cooperative_groups/memcpy_async.h: double-buffered tiles copied by the group, visible after the wait
# ---------------------------------------------------------------------------------------------

MEMCPY_ASYNC = r"""
#include <cooperative_groups.h>
#include <cooperative_groups/memcpy_async.h>
#include <cooperative_groups/reduce.h>
#include <cuda/barrier>
namespace cg = cooperative_groups;

// Each block streams its `tiles` tiles of blockDim.x floats through two shared buffers: the copy of
// tile k + 1 is issued after the wait for tile k, so it overlaps the work on tile k. Each thread
// reads the element at 7 * t % T, which another thread of the block copied: only the wait's group
// barrier makes it visible.
__global__ void block_sum_wait(const float* in, float* out, int tiles) {
    extern __shared__ float buf[];  // 2 * blockDim.x
    cg::thread_block block = cg::this_thread_block();
    const int T = blockDim.x, t = threadIdx.x;
    const float* src = in + (size_t)blockIdx.x * tiles * T;
    float acc = 0.0f;
    cg::memcpy_async(block, buf, src, sizeof(float) * T);
    for (int k = 0; k < tiles; ++k) {
        cg::wait(block);  // tile k landed (the only batch in flight)
        if (k + 1 < tiles) cg::memcpy_async(block, buf + ((k + 1) & 1) * T, src + (k + 1) * T, sizeof(float) * T);
        acc += buf[(k & 1) * T + (7 * t) % T];
        block.sync();  // everyone is done with tile k's buffer before tile k + 2 is copied into it
    }
    out[blockIdx.x * T + t] = acc;
}

// The same with the next copy issued before waiting: wait_prior<1> lets the newest batch (tile k + 1)
// stay in flight while tile k is summed. The size is a cuda::aligned_size_t<16> (16-byte chunks).
__global__ void block_sum_wait_prior(const float* in, float* out, int tiles) {
    extern __shared__ __align__(16) float buf[];
    cg::thread_block block = cg::this_thread_block();
    const int T = blockDim.x, t = threadIdx.x;
    const float* src = in + (size_t)blockIdx.x * tiles * T;
    float acc = 0.0f;
    cg::memcpy_async(block, buf, src, cuda::aligned_size_t<16>(sizeof(float) * T));
    for (int k = 0; k < tiles; ++k) {
        if (k + 1 < tiles) {
            cg::memcpy_async(block, buf + ((k + 1) & 1) * T, src + (k + 1) * T,
                             cuda::aligned_size_t<16>(sizeof(float) * T));
            cg::wait_prior<1>(block);
        } else {
            cg::wait(block);
        }
        acc += buf[(k & 1) * T + (7 * t) % T];
        block.sync();
    }
    out[blockIdx.x * T + t] = acc;
}

// One tile of 32 per warp, each with its own pair of buffers and its own chunk of the input; the
// copies and waits are the tile's (a __syncwarp), and the tile's sum is a cg::reduce. The last tile
// uses the element-count form memcpy_async(group, dst, dst_count, src, src_count).
__global__ void warp_sum(const float* in, float* out, int tiles) {
    extern __shared__ float buf[];  // 2 * 32 per warp
    auto tile = cg::tiled_partition<32>(cg::this_thread_block());
    const int warp = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = tile.thread_rank();
    float* mine = buf + (threadIdx.x / 32) * 64;
    const float* src = in + (size_t)warp * tiles * 32;
    float acc = 0.0f;
    cg::memcpy_async(tile, mine, src, sizeof(float) * 32);
    for (int k = 0; k < tiles; ++k) {
        if (k + 1 < tiles) {
            if (k + 2 < tiles) cg::memcpy_async(tile, mine + ((k + 1) & 1) * 32, src + (k + 1) * 32, sizeof(float) * 32);
            else cg::memcpy_async(tile, mine + ((k + 1) & 1) * 32, 32, src + (k + 1) * 32, 32);
            cg::wait_prior<1>(tile);
        } else {
            cg::wait(tile);
        }
        acc += mine[(k & 1) * 32 + (lane + 11) % 32];
        tile.sync();
    }
    out[warp] = cg::reduce(tile, acc, cg::plus<float>());
}

// Reads the tile before waiting for it: wrong on a GPU, and wrong here in some thread order.
__global__ void no_wait(const float* in, float* out) {
    extern __shared__ float buf[];
    cg::thread_block block = cg::this_thread_block();
    cg::memcpy_async(block, buf, in, sizeof(float) * blockDim.x);
    out[threadIdx.x] = buf[(threadIdx.x + 1) % blockDim.x];
    cg::wait(block);
}

// Promises 16-byte alignment for a size that is not a multiple of 16.
__global__ void broken_promise(const float* in, float* out) {
    extern __shared__ __align__(16) float buf[];
    cg::thread_block block = cg::this_thread_block();
    cg::memcpy_async(block, buf, in, cuda::aligned_size_t<16>(sizeof(float) * 3));
    cg::wait(block);
    out[threadIdx.x] = buf[0];
}
"""


def _tiles_input(n, seed):
    # small integers: every partial sum is exact in float32, so the comparison is exact
    return np.random.default_rng(seed).integers(-8, 9, n).astype(np.float32)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("kernel", ["block_sum_wait", "block_sum_wait_prior"])
def test_memcpy_async_block_double_buffered(order, kernel, no_hazards):
    mod = module(MEMCPY_ASYNC)
    blocks, tiles, T = 3, 5, 96
    x = _tiles_input(blocks * tiles * T, 1)
    out = np.zeros(blocks * T, np.float32)
    with sim.settings(order=order, seed=3):
        mod.get_function(kernel)((blocks,), (T,), (x, out, np.int32(tiles)), shared_mem=2 * T * 4)
    want = x.reshape(blocks, tiles, T).sum(1)[:, (7 * np.arange(T)) % T]
    assert (out.reshape(blocks, T) == want).all()


@pytest.mark.parametrize("order", ORDERS)
def test_memcpy_async_tile_of_32(order, no_hazards):
    mod = module(MEMCPY_ASYNC)
    blocks, warps, tiles = 2, 3, 4
    x = _tiles_input(blocks * warps * tiles * 32, 2)
    out = np.zeros(blocks * warps, np.float32)
    with sim.settings(order=order, seed=4):
        mod.get_function("warp_sum")((blocks,), (warps * 32,), (x, out, np.int32(tiles)), shared_mem=warps * 64 * 4)
    assert (out == x.reshape(blocks * warps, -1).sum(1)).all()


def test_memcpy_async_read_before_wait_sees_stale_data():
    # The stand-in copies each thread's share at once: in forward order thread t reads the element
    # of thread t + 1, which has not run yet, so the missing wait shows as a wrong answer.
    mod = module(MEMCPY_ASYNC)
    x = np.arange(1, 33, dtype=np.float32)
    out = np.zeros(32, np.float32)
    with sim.settings(order="forward"):
        mod.get_function("no_wait")((1,), (32,), (x, out), shared_mem=32 * 4)
    assert out[0] != x[1]


def test_memcpy_async_broken_alignment_promise_stops_the_launch():
    mod = module(MEMCPY_ASYNC)
    x = np.zeros(4, np.float32)
    out = np.zeros(32, np.float32)
    with pytest.raises(sim.SimDeviceAssertError, match="broken_promise.*multiples of its alignment"):
        mod.get_function("broken_promise")((1,), (32,), (x, out), shared_mem=16)


def test_memcpy_async_kernels_compile_with_nvrtc(have_nvrtc):
    # the same source is real CUDA: NVRTC with NVIDIA's headers accepts it for sm_80 (cp.async)
    from llmcupy import nvrtc

    res = nvrtc.compile_source(textwrap.dedent(MEMCPY_ASYNC), 80, filename="memcpy_async.cu")
    assert res.ok, res.log
    assert {k.kernel for k in res.kernels} >= {"block_sum_wait", "block_sum_wait_prior", "warp_sum"}


# ---------------------------------------------------------------------------------------------
# The ladders learners copy: Simon Boehm's SGEMM rungs (a template's bound in parentheses, float4
# loads with a transposed A tile) and a minimal flash-attention forward (tiles in dynamic shared
# memory, the online softmax rescale)
# ---------------------------------------------------------------------------------------------

SGEMM_LADDER = r"""
template <const int BM, const int BN, const int BK, const int TM, const int TN>
__global__ void __launch_bounds__((BM * BN) / (TM * TN), 1)
sgemm_vectorize(int M, int N, int K, float alpha, float* A, float* B, float beta, float* C) {
    const unsigned cRow = blockIdx.y, cCol = blockIdx.x;
    const int threadCol = threadIdx.x % (BN / TN), threadRow = threadIdx.x / (BN / TN);
    __shared__ float As[BM * BK];   // transposed: As[k][m]
    __shared__ float Bs[BK * BN];
    A += cRow * BM * K;
    B += cCol * BN;
    C += cRow * BM * N + cCol * BN;
    const unsigned innerRowA = threadIdx.x / (BK / 4), innerColA = threadIdx.x % (BK / 4);
    const unsigned innerRowB = threadIdx.x / (BN / 4), innerColB = threadIdx.x % (BN / 4);
    float results[TM * TN] = {0.0f}, regM[TM], regN[TN];
    for (int bk = 0; bk < K; bk += BK) {
        float4 a = reinterpret_cast<float4*>(&A[innerRowA * K + innerColA * 4])[0];
        As[(innerColA * 4 + 0) * BM + innerRowA] = a.x;
        As[(innerColA * 4 + 1) * BM + innerRowA] = a.y;
        As[(innerColA * 4 + 2) * BM + innerRowA] = a.z;
        As[(innerColA * 4 + 3) * BM + innerRowA] = a.w;
        reinterpret_cast<float4*>(&Bs[innerRowB * BN + innerColB * 4])[0] =
            reinterpret_cast<float4*>(&B[innerRowB * N + innerColB * 4])[0];
        __syncthreads();
        A += BK;
        B += BK * N;
        for (int k = 0; k < BK; ++k) {
            for (int i = 0; i < TM; ++i) regM[i] = As[k * BM + threadRow * TM + i];
            for (int i = 0; i < TN; ++i) regN[i] = Bs[k * BN + threadCol * TN + i];
            for (int m = 0; m < TM; ++m)
                for (int n = 0; n < TN; ++n) results[m * TN + n] += regM[m] * regN[n];
        }
        __syncthreads();
    }
    for (int m = 0; m < TM; ++m)
        for (int n = 0; n < TN; n += 4) {
            float4 c = reinterpret_cast<float4*>(&C[(threadRow * TM + m) * N + threadCol * TN + n])[0];
            c.x = alpha * results[m * TN + n] + beta * c.x;
            c.y = alpha * results[m * TN + n + 1] + beta * c.y;
            c.z = alpha * results[m * TN + n + 2] + beta * c.z;
            c.w = alpha * results[m * TN + n + 3] + beta * c.w;
            reinterpret_cast<float4*>(&C[(threadRow * TM + m) * N + threadCol * TN + n])[0] = c;
        }
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_sgemm_vectorized_rung_with_its_template_bound(order, no_hazards):
    name = "sgemm_vectorize<64, 64, 8, 8, 4>"   # 128 threads
    k = module(SGEMM_LADDER, name_expressions=[name]).get_function(name)
    assert k.max_threads_per_block == 128
    M = N = K = 64
    rng = np.random.default_rng(5)
    a, b = rng.integers(-3, 4, (M, K)).astype(np.float32), rng.integers(-3, 4, (K, N)).astype(np.float32)
    c = rng.integers(-3, 4, (M, N)).astype(np.float32)
    want = 2 * (a @ b) + 3 * c   # small integers: exact in float32 in any order
    with sim.settings(order=order):
        k((1, 1), (128,), (np.int32(M), np.int32(N), np.int32(K), np.float32(2), a, b, np.float32(3), c))
    assert (c == want).all()
    with pytest.raises(llmcupy.runtime.LaunchBoundsError, match=r"more than its __launch_bounds__ allow \(128\)"):
        k((1, 1), (256,), (np.int32(M), np.int32(N), np.int32(K), np.float32(2), a, b, np.float32(3), c))


FLASH_MINIMAL = r"""
#include <cuda/std/cmath>  // INFINITY: the original builds with nvcc, which has the host's <math.h>; NVRTC does not
// one block per (batch, head), Bc = Br = blockDim.x rows; Q_i, K_j, V_j and S in dynamic shared memory
__global__ void flash_forward(const float* Q, const float* K, const float* V, int N, int d, int Tc, int Tr,
                              int Bc, int Br, float scale, float* l, float* m, float* O) {
    int tx = threadIdx.x;
    int qkv = (blockIdx.x * gridDim.y + blockIdx.y) * N * d, lm = (blockIdx.x * gridDim.y + blockIdx.y) * N;
    extern __shared__ float sram[];
    int tile = Bc * d;
    float *Qi = sram, *Kj = sram + tile, *Vj = sram + 2 * tile, *S = sram + 3 * tile;
    for (int j = 0; j < Tc; j++) {
        for (int x = 0; x < d; x++) {
            Kj[tx * d + x] = K[qkv + tile * j + tx * d + x];
            Vj[tx * d + x] = V[qkv + tile * j + tx * d + x];
        }
        __syncthreads();
        for (int i = 0; i < Tr; i++) {
            for (int x = 0; x < d; x++) Qi[tx * d + x] = Q[qkv + tile * i + tx * d + x];
            float m_prev = m[lm + Br * i + tx], l_prev = l[lm + Br * i + tx];
            float row_m = -INFINITY;
            for (int y = 0; y < Bc; y++) {
                float sum = 0;
                for (int x = 0; x < d; x++) sum += Qi[tx * d + x] * Kj[y * d + x];
                S[Bc * tx + y] = sum * scale;
                row_m = fmaxf(row_m, sum * scale);
            }
            float row_l = 0;
            for (int y = 0; y < Bc; y++) {
                S[Bc * tx + y] = __expf(S[Bc * tx + y] - row_m);
                row_l += S[Bc * tx + y];
            }
            float m_new = fmaxf(m_prev, row_m);
            float l_new = __expf(m_prev - m_new) * l_prev + __expf(row_m - m_new) * row_l;
            for (int x = 0; x < d; x++) {
                float pv = 0;
                for (int y = 0; y < Bc; y++) pv += S[Bc * tx + y] * Vj[y * d + x];
                float* o = &O[qkv + tile * i + tx * d + x];
                *o = (l_prev * __expf(m_prev - m_new) * *o + __expf(row_m - m_new) * pv) / l_new;
            }
            m[lm + Br * i + tx] = m_new;
            l[lm + Br * i + tx] = l_new;
        }
        __syncthreads();
    }
}
"""


def test_minimal_flash_attention_forward_matches_softmax_attention(no_hazards):
    B, H, N, d, Bc = 1, 2, 32, 8, 16
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((B, H, N, d)).astype(np.float32) for _ in range(3))
    s = np.einsum("bhnd,bhmd->bhnm", q.astype(np.float64), k) / np.sqrt(d)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = np.einsum("bhnm,bhmd->bhnd", p / p.sum(-1, keepdims=True), v)
    kernel = module(FLASH_MINIMAL).get_function("flash_forward")
    for order, check in (("forward", ""), ("reverse", ""), ("random", "race,init")):
        o, l, m = np.zeros_like(q), np.zeros((B, H, N), np.float32), np.full((B, H, N), -np.inf, np.float32)
        with sim.settings(order=order, check=check):
            kernel((B, H), (Bc,), (q, k, v, np.int32(N), np.int32(d), np.int32(N // Bc), np.int32(N // Bc),
                                   np.int32(Bc), np.int32(Bc), np.float32(1 / np.sqrt(d)), l, m, o),
                   shared_mem=(3 * Bc * d + Bc * Bc) * 4)
        # float32 exponentials and two rescalings against a float64 reference
        np.testing.assert_allclose(o, want, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# What the preprocessor leaves: variables and kernels in disabled #if branches
# ---------------------------------------------------------------------------------------------

CONDITIONAL = r"""
#define TABLE __constant__
#ifdef USE_CONST
TABLE float
    weights[16];
#else
__device__ float weights_rw[16];
#endif
#if 0
__constant__ float gone[4];
__global__ void removed(float* out) { out[0] = gone[0]; }
#endif
#if defined(BIG) && BIG > 1
__global__ void __launch_bounds__(512) pick(float* out) {
    extern __shared__ float dyn[];
#else
__global__ void __launch_bounds__(64) pick(float* out) {
    __shared__ float dyn[64];
#endif
    dyn[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
#ifdef USE_CONST
    out[threadIdx.x] = dyn[threadIdx.x] + weights[threadIdx.x % 16];
#else
    out[threadIdx.x] = dyn[threadIdx.x] + weights_rw[threadIdx.x % 16];
#endif
}
"""


@pytest.mark.parametrize("options, table", [((), "weights_rw"), (("-DUSE_CONST", "-DBIG=2"), "weights")])
def test_declarations_in_disabled_branches_are_not_scanned(options, table):
    # the variables and kernels are those the compiler sees after the preprocessor: one defined only in
    # a disabled branch (#ifdef, #if 0, #if defined(X) && X > 1) is no build error and no get_global
    # name; a macro that expands to __constant__ and a declaration split over lines are found
    mod = module(CONDITIONAL, options=options)
    assert mod.variable_names == [table]
    assert mod.kernel_names == ["pick"]
    mod.global_array(table, np.float32)[:] = np.arange(16, dtype=np.float32)
    big = "-DBIG=2" in options
    out = np.zeros(64, np.float32)
    mod.get_function("pick")((1,), (64,), (out,), shared_mem=64 * 4 if big else 0)
    t = np.arange(64)
    assert (out == t + t % 16).all()
    # the bound of the branch compiled: 512 threads with -DBIG=2, 64 without
    with pytest.raises(LaunchBoundsError):
        mod.get_function("pick")((1,), (1024 if big else 128,), (np.zeros(1024, np.float32),),
                                 shared_mem=1024 * 4 if big else 0)
    with pytest.raises(AttributeError, match="no __constant__ or __device__ variable 'gone'"):
        mod.get_global("gone")


def test_a_source_with_its_own_line_directives_keeps_its_variables():
    # generated code renumbers its lines (#line 40 "gen.cu"): the preprocessed scan could not map them
    # back to the source and would lose what follows; such a source is scanned as written
    mod = module('#line 40 "gen.cu"\n__constant__ float scale[2];\n'
                 '__global__ void k(float* out) { out[threadIdx.x] = scale[threadIdx.x]; }\n')
    assert mod.variable_names == ["scale"] and mod.kernel_names == ["k"]
    mod.global_array("scale", np.float32)[:] = [3, 4]
    out = np.zeros(2, np.float32)
    mod.get_function("k")((1,), (2,), (out,))
    assert out.tolist() == [3, 4]
