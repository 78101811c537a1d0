"""The emulator's sanitizers (racecheck, memcheck, initcheck) on planted bugs, in every thread order.

Each planted kernel has its accesses on separate, known lines (found by a marker comment), so a
report can be checked for the exact source lines and threads; the fixed kernel must run clean.
"""

import ctypes
import json
import textwrap
import time

import numpy as np
import pytest

import llmcupy
from llmcupy import sim
from llmcupy.sim.launcher import parse_check

ORDERS = ("forward", "reverse", "random")


def kernel(code: str, name: str):
    code = textwrap.dedent(code)
    return llmcupy.RawModule(code=code, target="sim").get_function(name), code


def line_of(code: str, marker: str) -> str:
    """'kernel.cu:N' of the line carrying ``// marker``."""
    for n, text in enumerate(code.splitlines(), start=1):
        if f"// {marker}" in text:
            return f"kernel.cu:{n}"
    raise AssertionError(marker)


def run_checked(k, grid, block, args, order, check="all", shared_mem=0):
    """Launches under the sanitizers; the reports (empty when clean)."""
    with sim.settings(check=check, order=order, seed=7):
        try:
            k(grid, block, args, shared_mem=shared_mem)
        except sim.SimSanitizerError as exc:
            assert exc.reports, "a SimSanitizerError always carries its reports"
            return exc.reports
    return []


# --- settings ----------------------------------------------------------------------------------

def test_check_names_parse_and_bad_names_are_refused(monkeypatch):
    assert parse_check("race,memory,init") == parse_check("all") == 7
    assert parse_check("memory") == 2 and parse_check("") == 0
    with pytest.raises(ValueError, match="unknown sanitizer 'rase'"):
        parse_check("rase")
    with pytest.raises(ValueError, match="unknown sanitizer"):
        with sim.settings(check="memcheck"):
            pass


def test_env_variable_turns_the_sanitizers_on(monkeypatch):
    from llmcupy.sim import launcher

    monkeypatch.setenv("LLMCUPY_SIM_CHECK", "race,init")
    monkeypatch.setattr(launcher._settings, "check", None)
    assert launcher.check_bits() == 5


# --- racecheck ---------------------------------------------------------------------------------

TREE = r"""
extern "C" __global__ void tree(const float* in, float* out, int skip) {
    __shared__ float s[256];
    int t = threadIdx.x;
    s[t] = in[t];
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (t < stride) {
            float other = s[t + stride];  // READ
            s[t] += other;                // WRITE
        }
        if (stride != skip) __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = s[0];
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_tree_reduction_missing_a_barrier_is_reported_with_both_lines(order, no_hazards):
    k, code = kernel(TREE, "tree")
    x = np.arange(256, dtype=np.float32)
    out = np.zeros(2, np.float32)
    reports = run_checked(k, (2,), (256,), (x, out, np.int32(64)), order, check="race")
    races = [r for r in reports if r.kind in ("RAW", "WAR", "WAW")]
    assert races, f"no race reported in order {order}"
    r = races[0]
    assert {r.line, r.prev_line} == {line_of(code, "READ"), line_of(code, "WRITE")}, r.describe()
    assert r.space == "shared" and "'s'" in r.where and r.kernel == "tree"
    # the stride-64 step writes s[32..63] (warp 1), the stride-32 step reads them from warp 0
    assert {r.thread[0] // 32, r.prev_thread[0] // 32} == {0, 1} and not r.warp_synchronous
    assert r.thread[0] - r.prev_thread[0] in (32, -32)
    assert r.block[0] in (0, 1)


@pytest.mark.parametrize("order", ORDERS)
def test_tree_reduction_with_every_barrier_is_clean(order, no_hazards):
    k, _ = kernel(TREE, "tree")
    x = np.arange(256, dtype=np.float32)
    out = np.zeros(2, np.float32)
    assert run_checked(k, (2,), (256,), (x, out, np.int32(-1)), order) == []
    assert out[0] == x.sum()


WARP = r"""
extern "C" __global__ void neighbours(const float* in, float* out, int sync) {
    __shared__ float s[64];
    int t = threadIdx.x;
    s[t] = in[t];                 // STORE
    if (sync) __syncwarp();
    out[t] = s[t ^ 1];            // LOAD
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_warp_synchronous_race_is_flagged_and_syncwarp_makes_it_clean(order, no_hazards):
    k, code = kernel(WARP, "neighbours")
    x = np.arange(64, dtype=np.float32)
    out = np.zeros(64, np.float32)
    reports = run_checked(k, (1,), (64,), (x, out, np.int32(0)), order, check="race")
    assert reports and all(r.warp_synchronous for r in reports)
    r = reports[0]
    assert {r.line, r.prev_line} == {line_of(code, "STORE"), line_of(code, "LOAD")}
    assert r.thread[0] ^ 1 == r.prev_thread[0]
    assert "warp-synchronous" in r.describe()
    assert run_checked(k, (1,), (64,), (x, out, np.int32(1)), order) == []
    np.testing.assert_array_equal(out, x[np.arange(64) ^ 1])


ATOMICS = r"""
extern "C" __global__ void count(int* out) {
    __shared__ int c;
    if (threadIdx.x == 0) c = 0;
    __syncthreads();
    atomicAdd(&c, 1);
    atomicAdd(&out[1], 1);
    __syncthreads();
    if (threadIdx.x == 0) out[1 + gridDim.x - blockIdx.x] = c;   // a slot per block: one slot would be a race
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_atomics_on_one_address_are_not_a_race(order, no_hazards):
    k, _ = kernel(ATOMICS, "count")
    out = np.zeros(4, np.int32)
    assert run_checked(k, (2,), (96,), (out,), order) == []
    np.testing.assert_array_equal(out[1:], [192, 96, 96])


# The counter's initialisation is missing its barrier: the other threads' atomics race with thread 0's
# plain write, even though thread 0 itself then adds to the counter atomically. The atomic is the
# kernel's last statement, so its report must still name its kernel line (a tail call would not).
UNBARRIERED_INIT = r"""
extern "C" __global__ void count_shared(int* out) {
    __shared__ int c;
    if (threadIdx.x == 0) c = 0;                    // SHARED_INIT
    atomicAdd(&c, 1);                               // SHARED_ADD
}
extern "C" __global__ void count_global(int* out) {
    if (threadIdx.x == 0) out[0] = 0;               // GLOBAL_INIT
    atomicAdd(&out[0], 1);                          // GLOBAL_ADD
}
extern "C" __global__ void count_blocks(int* out) {
    if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = 0;   // BLOCKS_INIT
    __syncthreads();
    atomicAdd(&out[0], 1);                          // BLOCKS_ADD
}
extern "C" __global__ void count_blocks_published(int* out) {
    if (blockIdx.x == 0 && threadIdx.x == 0) { out[0] = 0; __threadfence(); }
    __syncthreads();
    atomicAdd(&out[0], 1);
}
"""


@pytest.mark.parametrize("name, blocks", [("count_shared", 1), ("count_global", 1), ("count_blocks", 2)])
@pytest.mark.parametrize("order", ORDERS)
def test_an_initialisation_without_a_barrier_races_with_the_atomics_after_it(name, blocks, order, no_hazards):
    """count_blocks: block 0 initialises, and nothing orders block 1's atomics after that write."""
    k, code = kernel(UNBARRIERED_INIT, name)
    reports = run_checked(k, (blocks,), (64,), (np.zeros(1, np.int32),), order, check="race")
    assert reports, f"{name}: thread 0's plain write and the other threads' atomics are unordered"
    init, add = (line_of(code, name.split("_")[1].upper() + suffix) for suffix in ("_INIT", "_ADD"))
    assert {(r.kind, r.line, r.prev_line) for r in reports} <= {("WAW", add, init), ("WAW", init, add)}


def test_an_initialisation_published_before_the_other_blocks_atomics_is_ordered(no_hazards):
    """With one worker in forward order block 0 runs first: its write, fence and atomic publish the
    write, and block 1's atomics acquire it (the rule a report between blocks states). Another order
    may run block 1 first, and then the same kernel is a race."""
    k, _ = kernel(UNBARRIERED_INIT, "count_blocks_published")
    out = np.zeros(1, np.int32)
    with sim.settings(workers=1):
        assert run_checked(k, (2,), (64,), (out,), "forward", check="race") == []
    assert out[0] == 128


# The Programming Guide's atomicAdd(double) and a float atomicMax, each a CAS loop whose first read is a
# plain one: unordered with the other threads' CAS, but only a guess the CAS checks. `misuse` adds a
# plain read of `flag` (which the even threads bump with atomicAdd) whose value is used otherwise.
CAS_LOOPS = r"""
__device__ double guide_atomic_add(double* address, double val) {
    unsigned long long int* address_as_ull = (unsigned long long int*)address;
    unsigned long long int old = *address_as_ull, assumed;
    do {
        assumed = old;
        old = atomicCAS(address_as_ull, assumed, __double_as_longlong(val + __longlong_as_double(assumed)));
    } while (assumed != old);
    return __longlong_as_double(old);
}
__device__ float atomic_max_float(float* address, float val) {
    int* address_as_i = (int*)address;
    int old = *address_as_i, assumed;
    do {
        assumed = old;
        old = atomicCAS(address_as_i, assumed, __float_as_int(fmaxf(val, __int_as_float(assumed))));
    } while (assumed != old);
    return __int_as_float(old);
}
extern "C" __global__ void cas_loops(const float* x, double* sum, float* block_max, double* block_sum,
                                     unsigned* seen, int misuse) {
    __shared__ double total;
    __shared__ float best;
    __shared__ unsigned flag;
    int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    if (t == 0) { total = 0.0; best = -1e30f; flag = 0; }
    __syncthreads();
    guide_atomic_add(&total, x[i]);
    atomic_max_float(&best, x[i]);
    guide_atomic_add(sum, x[i]);                   // global memory, from every block
    unsigned v = 0;
    if (t % 2 == 0) atomicAdd(&flag, 1u);
    else if (misuse) v = flag;                     // READ
    if (misuse == 3) __syncthreads();
    if (t % 2 == 1) {
        if (misuse == 1) seen[i] = v;              // used as a result
        if (misuse == 2) atomicCAS(&flag, v + 1000u, 0u);   // a CAS checks another value
        if (misuse >= 3) atomicCAS(&flag, v, v);   // 3: after a barrier; 4: validated, no race
    }
    __syncthreads();
    if (t == 0) { block_max[blockIdx.x] = best; block_sum[blockIdx.x] = total; }
}
"""


def _cas_loops(k, order, misuse, blocks=4, workers=2):
    x = ((np.arange(64 * blocks) * 37) % 101).astype(np.float32)
    args = (x, np.zeros(1), np.zeros(blocks, np.float32), np.zeros(blocks), np.zeros(64 * blocks, np.uint32))
    with sim.settings(workers=workers):
        reports = run_checked(k, (blocks,), (64,), args + (np.int32(misuse),), order, check="race")
    return reports, x, args


@pytest.mark.parametrize("order", ORDERS)
def test_the_programming_guides_cas_loops_are_no_race(order, no_hazards):
    # before: racecheck reported their first plain read against another thread's atomicCAS (RAW on
    # shared memory within a block; between blocks on the global sum, in some runs as a WAR)
    k, _ = kernel(CAS_LOOPS, "cas_loops")
    for misuse in (0, 4) * 4:   # between blocks, another block's CAS lands between read and CAS in some runs
        reports, x, (_, total, block_max, block_sum, _) = _cas_loops(k, order, misuse)
        assert reports == [], reports[0].describe()
        per_block = x.reshape(4, 64).astype(np.float64)
        np.testing.assert_array_equal(block_max, per_block.max(axis=1))
        np.testing.assert_array_equal(block_sum, per_block.sum(axis=1))   # integers: exact in any order
        assert total[0] == per_block.sum()


@pytest.mark.parametrize("misuse", [1, 2, 3])
def test_a_plain_read_racing_with_atomics_is_reported_unless_its_cas_validates_it(misuse, no_hazards):
    k, code = kernel(CAS_LOOPS, "cas_loops")
    for order in ORDERS:
        reports, _, _ = _cas_loops(k, order, misuse, blocks=1)
        assert reports, (order, misuse)
        assert {r.kind for r in reports} <= {"RAW", "WAR"}
        assert all(r.space == "shared" and "'flag'" in r.where for r in reports), reports[0].describe()
        assert line_of(code, "READ") in {r.line for r in reports} | {r.prev_line for r in reports}



def test_validated_reads_of_a_large_grid_are_matched_at_launch_end_without_a_scan_each(no_hazards):
    # Odd blocks validate each thread's read with a CAS, even blocks only read: one validated read and one
    # deferred WAR per thread of every other block (131072 of each here). Before, each deferred WAR was
    # looked up by scanning every validated read, and the launch's end took 128 s here; now about a second.
    # One worker: blocks run one after another, so the counts (and the time) are the same on any machine;
    # the limit leaves a 20-fold margin above the run's time and is 6 times below the old one's.
    k, code = kernel(r"""
        extern "C" __global__ void alternate(unsigned* buf) {
            unsigned t = threadIdx.x;
            unsigned old = buf[t];                                  // READ
            if (blockIdx.x % 2) atomicCAS(&buf[t], old, old + 1u);
        }
        """, "alternate")
    buf = np.zeros(256, np.uint32)
    with sim.settings(workers=1):
        run_checked(k, (1,), (256,), (buf,), "forward", check="race")   # compiled before the clock starts
        start = time.monotonic()
        reports = run_checked(k, (1024,), (256,), (buf,), "forward", check="race")
        took = time.monotonic() - start
    assert took < 20, f"{took:.0f} s"
    np.testing.assert_array_equal(buf, 512)
    # the even blocks' reads are no CAS's guess: reported against the odd blocks' CAS
    assert {r.kind for r in reports} == {"RAW", "WAR"}
    assert line_of(code, "READ") in {r.line for r in reports} | {r.prev_line for r in reports}


def test_deferred_wars_of_a_large_grid_hold_the_memory_of_the_running_blocks_only(no_hazards):
    # The Programming Guide's atomicAdd(double) from each of 1024 x 256 threads on one global sum: every
    # thread's first read races with other blocks' CAS and waits (a deferred WAR, a validated read) until
    # its block ends. Before, each deferred WAR kept a whole report until the launch's end (about 50 MB
    # here); now a running block's entries are settled when it ends, so the peak is that of the blocks
    # running at once (two workers: tens of KiB), whatever the grid. The limit, 1 MiB, is 6 times what
    # the grid's 262144 reads alone would need at 24 bytes each.
    k, _ = kernel(CAS_LOOPS.split("extern")[0] + r"""
        extern "C" __global__ void add_all(const float* x, double* sum) {
            guide_atomic_add(sum, x[blockIdx.x * blockDim.x + threadIdx.x]);
        }
        """, "add_all")
    x = (np.arange(1024 * 256) % 7).astype(np.float32)
    total = np.zeros(1)
    with sim.settings(workers=2):
        reports = run_checked(k, (1024,), (256,), (x, total), "forward", check="race")
    assert reports == [], reports[0].describe()
    assert total[0] == x.astype(np.float64).sum()
    peak = k.module._sim_library.checked()._lib.llmcupy_sim_check_deferred_peak_bytes
    peak.restype = ctypes.c_ulonglong
    assert 0 < peak() < 1 << 20, peak()


def test_a_cas_of_another_value_does_not_validate_a_plain_read_between_blocks(no_hazards):
    # Block 1 swaps a value in with atomicExch; block 0 reads it plainly, keeps what it read, then
    # CASes the address with a constant. That CAS checks nothing about the read, so the read races
    # with the exchange. Before, any CAS by the reading thread on global memory validated its read,
    # and this ran clean in every order; a CAS of the value read (the Programming Guide's loop, above)
    # still validates it.
    k, code = kernel(r"""
        extern "C" __global__ void swap_and_peek(unsigned* p, unsigned* out, int same) {
            if (threadIdx.x != 0) return;
            if (blockIdx.x == 1) {
                atomicExch(p, 5u);                                  // EXCHANGE
            } else {
                unsigned v = p[0];                                  // READ
                out[0] = v;
                atomicCAS(p, same ? v : 12345u, 7u);
            }
        }
        """, "swap_and_peek")
    for order in ORDERS:
        for workers in (1, 2):
            with sim.settings(workers=workers):
                args = (np.zeros(1, np.uint32), np.zeros(1, np.uint32))
                reports = run_checked(k, (2,), (32,), args + (np.int32(0),), order, check="race")
                assert reports, (order, workers)
                assert {r.kind for r in reports} <= {"RAW", "WAR"}
                assert {r.line for r in reports} | {r.prev_line for r in reports} >= {line_of(code, "READ"),
                                                                                      line_of(code, "EXCHANGE")}
                assert run_checked(k, (2,), (32,), args + (np.int32(1),), order, check="race") == []


GLOBAL_RACE = r"""
extern "C" __global__ void publish(float* data) {
    int t = threadIdx.x;
    if (t == 0) data[0] = 42.0f;          // PUBLISH
    data[t + 1] = data[0] + t;            // CONSUME
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_global_memory_race_within_a_block(order, no_hazards):
    k, code = kernel(GLOBAL_RACE, "publish")
    data = np.zeros(65, np.float32)
    reports = run_checked(k, (1,), (64,), (data,), order, check="race")
    assert reports and reports[0].space == "global" and "argument 0" in reports[0].where
    assert {reports[0].line, reports[0].prev_line} == {line_of(code, "PUBLISH"), line_of(code, "CONSUME")}


# --- racecheck between blocks -------------------------------------------------------------------

BETWEEN_BLOCKS = r"""
extern "C" __global__ void handoff(float* data) {
    if (blockIdx.x == 0 && threadIdx.x == 0) data[0] = 42.0f;    // PUBLISH
    if (blockIdx.x == 1) data[1 + threadIdx.x] = data[0];        // CONSUME
}
extern "C" __global__ void same_slot(float* out) {
    if (threadIdx.x == 0) out[0] = 1.0f;                         // EVERY_BLOCK
}
"""


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("order", ORDERS)
def test_a_block_reading_what_another_block_wrote_is_a_race(order, workers, no_hazards):
    # whichever block runs first, the second access conflicts with the first: RAW or WAR
    k, code = kernel(BETWEEN_BLOCKS, "handoff")
    with sim.settings(workers=workers):
        reports = run_checked(k, (2,), (32,), (np.zeros(33, np.float32),), order, check="race")
    assert reports and all(r.between_blocks for r in reports), [r.describe() for r in reports]
    r = reports[0]
    assert r.kind in ("RAW", "WAR") and r.space == "global" and r.where == "argument 0"
    assert {r.line, r.prev_line} == {line_of(code, "PUBLISH"), line_of(code, "CONSUME")}
    assert {r.block, r.prev_block} == {(0, 0, 0), (1, 0, 0)}
    assert "between blocks" in r.describe() and "__threadfence" in r.describe()


@pytest.mark.parametrize("order", ORDERS)
def test_blocks_writing_one_slot_is_a_race_even_with_the_same_value(order, no_hazards):
    # benign-looking, but a data race in CUDA's memory model: the kernel's result would depend on
    # which write lands last if the values ever differed
    k, code = kernel(BETWEEN_BLOCKS, "same_slot")
    reports = run_checked(k, (3,), (32,), (np.zeros(1, np.float32),), order, check="race")
    assert reports and reports[0].kind == "WAW" and reports[0].between_blocks
    assert reports[0].line == reports[0].prev_line == line_of(code, "EVERY_BLOCK")


# The last-block reduction of llm.c's layernorm_backward 5-7 (and CUDA's threadFenceReduction
# sample): each block writes its partial, fences, counts itself in with an atomic; the block that
# counts last reads every partial. Without the fence nothing orders the partials before the count.
LAST_BLOCK = r"""
extern "C" __global__ void last_block(const float* x, float* partial, unsigned* counter, float* out, int fence) {
    __shared__ float s[64];
    __shared__ bool is_last;
    s[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
    __syncthreads();
    if (threadIdx.x == 0) {
        float a = 0.0f;
        for (int i = 0; i < blockDim.x; i++) a += s[i];
        partial[blockIdx.x] = a;                                  // PARTIAL
    }
    if (fence) __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) is_last = atomicAdd(counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (is_last && threadIdx.x == 0) {
        float a = 0.0f;
        for (int b = 0; b < gridDim.x; b++) a += partial[b];      // GATHER
        out[0] = a;
    }
}
"""


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("order", ORDERS)
def test_last_block_reduction_is_ordered_by_its_fence_and_racy_without(order, workers, no_hazards):
    k, code = kernel(LAST_BLOCK, "last_block")
    x = np.arange(8 * 64, dtype=np.float32)

    def run(fence):
        out = np.zeros(1, np.float32)
        args = (x, np.zeros(8, np.float32), np.zeros(1, np.uint32), out, np.int32(fence))
        with sim.settings(workers=workers):
            reports = run_checked(k, (8,), (64,), args, order, check="race")
        assert out[0] == x.sum()  # the emulator runs it right either way: only the checker can tell
        return reports

    assert run(fence=1) == []
    reports = run(fence=0)
    assert reports and all(r.kind == "RAW" and r.between_blocks for r in reports), [r.describe() for r in reports]
    assert {(r.prev_line, r.line) for r in reports} == {(line_of(code, "PARTIAL"), line_of(code, "GATHER"))}


# CUDA's threadFenceReduction sample counts the blocks in a `__device__ unsigned int`, not in an
# argument, and the last block resets it for the next launch: the atomic on the library's own
# variable orders the partials just as one on a launch buffer does.
LAST_BLOCK_DEVICE_COUNTER = r"""
__device__ unsigned int retired = 0;
extern "C" __global__ void last_block(const float* x, float* partial, float* out, int fence) {
    __shared__ bool is_last;
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = x[blockIdx.x];                          // PARTIAL
        if (fence) __threadfence();
        is_last = atomicInc(&retired, gridDim.x) == gridDim.x - 1;
    }
    __syncthreads();
    if (is_last && threadIdx.x == 0) {
        float a = 0.0f;
        for (int b = 0; b < gridDim.x; b++) a += partial[b];          // GATHER
        out[0] = a;
        retired = 0;
    }
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_last_block_reduction_counting_in_a_device_variable_is_ordered_by_its_fence(order, no_hazards):
    k, code = kernel(LAST_BLOCK_DEVICE_COUNTER, "last_block")
    x = np.arange(8, dtype=np.float32)

    def run(fence):
        out = np.zeros(1, np.float32)
        with sim.settings(workers=2):
            reports = run_checked(k, (8,), (32,), (x, np.zeros(8, np.float32), out, np.int32(fence)), order,
                                  check="race")
        assert out[0] == x.sum()
        return reports

    assert run(fence=1) == [], [r.describe() for r in run(fence=1)]
    reports = run(fence=0)
    assert {(r.prev_line, r.line) for r in reports} == {(line_of(code, "PARTIAL"), line_of(code, "GATHER"))}


# Data handed from block 0 to block 1 through a volatile flag instead of an atomic: PTX's volatile
# accesses are strong, so "write; fence; volatile store" releases and a volatile load that sees the
# flag acquires. Block 1 reads the data only once it has seen the flag.
FLAG_HANDOFF = r"""
extern "C" __global__ void flag_handoff(float* data, int* flag, float* out, int fence, int spin) {
    if (threadIdx.x != 0) return;
    if (blockIdx.x == 0) {
        data[0] = 42.0f;                                          // WRITE
        if (fence) __threadfence();
        *(volatile int*)flag = 1;                                 // RAISE
    } else {
        int seen = *(volatile int*)flag;
        while (spin && !seen) seen = *(volatile int*)flag;        // only with blocks on two workers
        if (seen) out[0] = data[0];                               // READ
    }
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_a_volatile_flag_after_a_fence_hands_data_to_another_block(order, no_hazards):
    k, code = kernel(FLAG_HANDOFF, "flag_handoff")

    def run(fence, spin, workers):
        out = np.zeros(1, np.float32)
        args = (np.zeros(1, np.float32), np.zeros(1, np.int32), out, np.int32(fence), np.int32(spin))
        with sim.settings(workers=workers):
            reports = run_checked(k, (2,), (32,), args, order, check="race")
        return reports, out[0]

    # one worker runs block 0, then block 1, which finds the flag raised
    reports, got = run(fence=1, spin=0, workers=1)
    assert got == 42.0 and reports == [], [r.describe() for r in reports]
    reports, got = run(fence=0, spin=0, workers=1)   # no fence: the flag publishes nothing
    assert got == 42.0 and reports, "a handoff without a fence must be reported"
    assert {(r.prev_line, r.line) for r in reports} == {(line_of(code, "WRITE"), line_of(code, "READ"))}
    assert all(r.kind == "RAW" and r.between_blocks for r in reports)
    # two workers: block 1 may spin on the flag while block 0 runs, the pattern's real use
    for _ in range(3):
        reports, got = run(fence=1, spin=1, workers=2)
        assert got == 42.0 and reports == [], [r.describe() for r in reports]


ACCUMULATE_THEN_READ = r"""
extern "C" __global__ void accumulate(float* total, float* copy, int strong) {
    atomicAdd(total, 1.0f);                                      // ADD
    __syncthreads();   // orders this block's own atomics before the read; other blocks' stay unordered
    if (blockIdx.x == 1 && threadIdx.x == 0) {
        if (strong) copy[0] = *(volatile float*)total;           // a volatile load: strong, like an atomic
        else copy[0] = *total;                                   // PEEK
    }
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_atomics_from_every_block_are_clean_but_a_plain_read_of_their_sum_is_not(order, no_hazards):
    k, code = kernel(ACCUMULATE_THEN_READ, "accumulate")
    args = (np.zeros(1, np.float32), np.zeros(1, np.float32))
    reports = run_checked(k, (4,), (32,), args + (np.int32(0),), order, check="race")
    assert reports and all(r.between_blocks for r in reports)
    assert {r.kind for r in reports} <= {"RAW", "WAR"}
    assert {(r.prev_line, r.line) for r in reports} <= {(line_of(code, "ADD"), line_of(code, "PEEK")),
                                                        (line_of(code, "PEEK"), line_of(code, "ADD"))}
    # PTX's memory model: volatile and atomic accesses are both "strong" and do not race with each
    # other (layernorm_backward 8-10 read their atomicCAS counter through a volatile load)
    assert run_checked(k, (4,), (32,), (np.zeros(1, np.float32), np.zeros(1, np.float32), np.int32(1)), order,
                       check="race") == []


# --- memcheck ----------------------------------------------------------------------------------

OOB = r"""
extern "C" __global__ void spill(float* out, int n) {
    int t = threadIdx.x;
    if (t < n) out[t] = 1.0f;
    if (t == 5) out[n + 3] = 7.0f;        // STRAY
}
"""


def _standalone(full: np.ndarray, n: int) -> np.ndarray:
    """An array of ``n`` floats whose root allocation is exactly its own: memory after it (the rest of
    ``full``) is outside every buffer of the launch, yet ours to inspect."""
    return np.frombuffer(memoryview(full).cast("B")[: 4 * n], dtype=np.float32)


@pytest.mark.parametrize("order", ORDERS)
def test_out_of_bounds_global_write_is_stopped_before_it_lands(order, monkeypatch, no_hazards):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    k, code = kernel(OOB, "spill")
    full = np.zeros(48, np.float32)
    out = _standalone(full, 32)
    reports = run_checked(k, (1,), (32,), (out, np.int32(32)), order, check="memory")
    assert len(reports) == 1
    r = reports[0]
    assert r.kind == "OOB" and r.write and r.size == 4
    assert r.line == line_of(code, "STRAY") and r.thread == (5, 0, 0) and r.block == (0, 0, 0)
    assert r.address == out.ctypes.data + 4 * 35
    assert "12 bytes past the end of argument 0" in r.where and "128-byte allocation" in r.where
    assert np.all(full[32:] == 0), "the stray write landed"
    assert "memcheck" in r.describe() and "thread (5,0,0)" in r.describe()


def test_a_view_may_touch_its_neighbours_in_the_same_allocation(no_hazards):
    k, _ = kernel(OOB, "spill")
    full = np.zeros(48, np.float32)
    out = full[:32]  # .base is `full`: out[35] is inside the allocation, as on a GPU
    assert run_checked(k, (1,), (32,), (out, np.int32(32)), "forward") == []
    assert full[35] == 7.0


# A vector load through reinterpret_cast (the float4 idiom of every bandwidth tutorial) on a view
# that starts one float into its array: a GPU stops the launch with "misaligned address"; x86 loads
# a float2 from any address, so without memcheck the emulator would give the GPU-less answer.
MISALIGNED = r"""
extern "C" __global__ void copy2(float* out, const float* in) {
    int i = threadIdx.x;
    float2 v = reinterpret_cast<const float2*>(in)[i];        // LOAD2
    reinterpret_cast<float2*>(out)[i] = v;
}
extern "C" __global__ void copy4(float* out, const float* in) {
    int i = threadIdx.x;
    float4 v = reinterpret_cast<const float4*>(in)[i];        // LOAD4
    reinterpret_cast<float4*>(out)[i] = v;
}
"""


@pytest.mark.parametrize("name, size, marker", [("copy2", 8, "LOAD2"), ("copy4", 16, "LOAD4")])
def test_a_misaligned_vector_access_is_reported_by_memcheck(name, size, marker, no_hazards):
    k, code = kernel(MISALIGNED, name)
    x, y = np.arange(4 * 32 + 4, dtype=np.float32), np.zeros(4 * 32 + 4, np.float32)
    assert run_checked(k, (1,), (32,), (y, x), "forward", check="memory") == []
    copied = 32 * size // 4
    assert np.array_equal(y[:copied], x[:copied])
    y[:] = 0
    reports = run_checked(k, (1,), (32,), (y[1:], x[1:]), "forward", check="memory")
    assert len(reports) == 1, [r.describe() for r in reports]
    r = reports[0]
    assert r.kind == "OOB" and not r.write and r.size == size and r.line == line_of(code, marker)
    assert r.address == x.ctypes.data + 4
    assert f"misaligned: not a multiple of {size}" in r.where and "misaligned address" in r.where, r.where
    assert not y.any(), "the launch stops before the access"


# A 16-byte struct of 8-byte alignment (two doubles) copied whole: g++ makes it one 16-byte access
# and calls the aligned hook (it does for 8-byte alignment and more), but its address need only be a
# multiple of 8, as on a GPU; `Q.p` sits at offset 8 of each 24-byte element.
PAIR_IN_A_STRUCT = r"""
struct Pair { double x, y; };
struct Q { double w; Pair p; };
extern "C" __global__ void pairs(const Q* q, Pair* out) {
    out[threadIdx.x] = q[threadIdx.x].p;
}
"""


def test_a_16_byte_struct_of_8_byte_alignment_is_no_misaligned_access(no_hazards):
    # before: memcheck reported "misaligned: not a multiple of 16" for q[1].p, at 16 * 1 + 8 bytes
    k, _ = kernel(PAIR_IN_A_STRUCT, "pairs")
    q, out = np.arange(3 * 4, dtype=np.float64), np.zeros(2 * 4, np.float64)
    assert run_checked(k, (1,), (4,), (q, out), "forward", check="memory") == []
    assert out.tolist() == [v for i in range(4) for v in (3 * i + 1, 3 * i + 2)]


def test_a_float4_8_bytes_off_16_under_memcheck_stops_as_a_misaligned_access(no_hazards):
    # memcheck cannot tell this float4 from an aligned 16-byte struct of two doubles (one hook for
    # both), so the instrumented build's own aligned load faults; the fault handler's reads were shown
    # to memcheck as the kernel's ("invalid 8-byte read ... at llmcupy_sim.h:1776, 2699024 bytes past
    # the end of argument 0")
    k, _ = kernel(MISALIGNED, "copy4")
    x, y = np.arange(4 * 32 + 4, dtype=np.float32), np.zeros(4 * 32 + 4, np.float32)
    with sim.settings(check="memory"), pytest.raises(sim.SimMemoryFaultError) as info:
        k((1,), (32,), (y, x[2:]))
    message = str(info.value)
    # not "the launch again inside `with llmcupy.sim.settings(check="memory"):` names the line"
    assert "misaligned 16-byte access" in message and "memcheck passed it" in message, message


DEVICE_HEAP = r"""
extern "C" __global__ void heap(float* out, int past) {
    float* a = (float*)malloc(4 * sizeof(float));
    float* b = new float[4];
    int i = threadIdx.x % 4;
    a[i] = 1.0f;
    b[i] = 2.0f;
    if (past && threadIdx.x == 0) b[4] = 3.0f;                 // PAST
    out[threadIdx.x] = a[i] + b[i];
    free(a);
    delete[] b;
}
"""


def test_memory_from_a_kernels_own_malloc_and_new_is_known_to_memcheck(no_hazards):
    # CUDA gives kernels a heap (malloc/free, new/delete). Before, memcheck knew only the launch's
    # arguments, so every access to such a block stopped the launch as "invalid 4-byte write ...
    # 53472 bytes past the end of argument 0"; now the blocks a kernel allocates are memory of the
    # launch until freed, and a write past one's end is named by it
    k, code = kernel(DEVICE_HEAP, "heap")
    out = np.zeros(8, np.float32)
    assert run_checked(k, (2,), (8,), (out, np.int32(0)), "forward", check="memory") == []
    np.testing.assert_array_equal(out, 3.0)
    reports = run_checked(k, (1,), (8,), (out, np.int32(1)), "forward", check="memory")
    assert len(reports) == 1 and reports[0].line == line_of(code, "PAST"), [r.describe() for r in reports]
    assert "0 bytes past the end of a 16-byte block from the kernel's malloc or new" in reports[0].where, \
        reports[0].where


def test_a_plain_launch_faulting_on_a_misaligned_float4_says_misaligned():
    # x86's aligned vector load faults with no address (a general-protection fault); the message
    # must not call that an out-of-bounds access at address 0
    k, _ = kernel(MISALIGNED, "copy4")
    x, y = np.arange(4 * 32 + 4, dtype=np.float32), np.zeros(4 * 32 + 4, np.float32)
    with pytest.raises(sim.SimMemoryFaultError) as info:
        k((1,), (32,), (y[1:], x[1:]))
    message = str(info.value)
    assert "misaligned" in message and "out-of-bounds memory access at 0 " not in message, message
    assert 'check="memory"' in message, message


SHARED_OOB = r"""
extern "C" __global__ void static_shared(float* out, int idx, int write) {
    __shared__ float s[32];
    int t = threadIdx.x;
    s[t] = t;
    __syncthreads();
    if (t == 3) {
        if (write) s[idx] = 1.0f;        // SWRITE
        else out[0] = s[idx];             // SREAD
    }
}
extern "C" __global__ void dynamic_shared(float* out, int idx, int write) {
    extern __shared__ float d[];
    int t = threadIdx.x;
    d[t] = t;
    __syncthreads();
    if (t == 3) {
        if (write) d[idx] = 1.0f;        // DWRITE
        else out[0] = d[idx];             // DREAD
    }
}
"""


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("which", ["static", "dynamic"])
@pytest.mark.parametrize("write", [0, 1])
@pytest.mark.parametrize("idx", [32, -1, 40000, -40000, 1 << 28])
def test_shared_memory_out_of_bounds_read_and_write(order, which, write, idx, no_hazards):
    k, code = kernel(SHARED_OOB, f"{which}_shared")
    out = np.zeros(1, np.float32)
    reports = run_checked(k, (1,), (32,), (out, np.int32(idx), np.int32(write)), order, check="memory",
                          shared_mem=128 if which == "dynamic" else 0)
    assert len(reports) == 1, [r.describe() for r in reports]
    r = reports[0]
    marker = ("S" if which == "static" else "D") + ("WRITE" if write else "READ")
    assert r.kind == "OOB" and bool(r.write) == bool(write) and r.thread == (3, 0, 0)
    assert r.line == line_of(code, marker)
    # static arrays and the dynamic memory live in one address window of their own (+-8 GiB, so 160 KB
    # or 1 GiB out cannot land in a fiber stack, thread-local storage or a heap block): at any
    # distance the access is named by its array, with the exact distance from the 128-byte array
    assert r.space == "shared", r.describe()
    assert ("shared array 's' (line 3, 128 bytes)" if which == "static" else "dynamic shared memory") in r.where
    assert f"{idx * 4 - 128 if idx > 0 else -idx * 4} bytes {'past the end of' if idx > 0 else 'before'}" in r.where


@pytest.mark.parametrize("which", ["static", "dynamic"])
@pytest.mark.parametrize("write", [0, 1])
def test_far_shared_index_faults_a_plain_launch_with_the_distance(which, write):
    """Without a check mode, an index far outside a shared array faults in the shared-memory window
    (instead of reading or writing whatever thread-local storage or heap block lay there): the launch
    raises, saying which access and how far from which array, and the process lives on."""
    k, _ = kernel(SHARED_OOB, f"{which}_shared")
    out = np.zeros(1, np.float32)
    shared_mem = 128 if which == "dynamic" else 0
    with pytest.raises(sim.SimMemoryFaultError) as err:
        k((1,), (32,), (out, np.int32(40000), np.int32(write)), shared_mem=shared_mem)
    what = "shared array 's' (line 3, 128 bytes)" if which == "static" else \
        "the dynamic shared memory (extern __shared__, 128 bytes = the launch's shared_mem)"
    assert (f"kernel {which}_shared crashed with SIGSEGV in block (0,0,0), thread (3,0,0): a shared memory access "
            f"159872 bytes past the end of {what}") in str(err.value)
    k((1,), (32,), (out, np.int32(31), np.int32(0)), shared_mem=shared_mem)
    assert out[0] == 31


def test_an_extern_shared_array_launched_without_shared_mem_is_named(no_hazards):
    """A kernel that declares `extern __shared__` but is launched with shared_mem = 0 (a forgotten
    launch argument) writes bytes it does not have: the plain launch and memcheck both name the
    dynamic memory and its size."""
    k, _ = kernel(SHARED_OOB, "dynamic_shared")
    out = np.zeros(1, np.float32)
    with pytest.raises(sim.SimSharedMemoryError) as err:
        k((1,), (32,), (out, np.int32(31), np.int32(0)))
    assert ("a write landed just past the end of the dynamic shared memory (extern __shared__, 0 bytes = the "
            "launch's shared_mem): an out-of-bounds index or too small a shared_mem") in str(err.value)
    reports = run_checked(k, (1,), (32,), (out, np.int32(31), np.int32(0)), "forward", check="memory")
    assert len(reports) == 1 and reports[0].write, [r.describe() for r in reports]
    assert reports[0].where == ("0 bytes past the end of the dynamic shared memory (extern __shared__, 0 bytes = "
                                "the launch's shared_mem)")


SHARED_TWO_KERNELS = r"""
extern "C" __global__ void first(float* out) {
    __shared__ float a[16];
    a[threadIdx.x] = 1.0f + threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = a[15 - threadIdx.x];
}
extern "C" __global__ void second(float* out, int idx) {
    __shared__ float c[16];
    c[threadIdx.x] = 0.0f;
    __syncthreads();
    if (threadIdx.x == 0) out[0] = c[idx];
}
"""


@pytest.mark.parametrize("idx", [16, 24, 40])
def test_another_kernels_shared_array_is_not_this_blocks(idx, no_hazards):
    """The emulator keeps each static array's storage for the OS thread's life, so an index past one
    kernel's array may land in another kernel's, still mapped: memcheck reports it all the same,
    named by the array indexed (a GPU block has only its own kernel's arrays)."""
    k1, _ = kernel(SHARED_TWO_KERNELS, "first")
    k2, _ = kernel(SHARED_TWO_KERNELS, "second")
    out = np.zeros(16, np.float32)
    with sim.settings(workers=1):
        k1((1,), (16,), (out,))
        assert out.tolist() == list(range(16, 0, -1))
        reports = run_checked(k2, (1,), (16,), (out, np.int32(idx)), "forward", check="memory")
    assert len(reports) == 1 and reports[0].kind == "OOB", [r.describe() for r in reports]
    assert f"{idx * 4 - 64} bytes past the end of shared array 'c' (line 9, 64 bytes)" in reports[0].where


@pytest.mark.parametrize("which", ["static", "dynamic"])
def test_in_bounds_shared_memory_is_clean(which, no_hazards):
    k, _ = kernel(SHARED_OOB, f"{which}_shared")
    out = np.zeros(1, np.float32)
    for order in ORDERS:
        assert run_checked(k, (1,), (32,), (out, np.int32(31), np.int32(0)), order,
                           shared_mem=128 if which == "dynamic" else 0) == []
        assert out[0] == 31


# --- initcheck ---------------------------------------------------------------------------------

UNINIT = r"""
extern "C" __global__ void half_filled(float* out, int filled) {
    __shared__ float s[64];
    int t = threadIdx.x;
    if (t < filled) s[t] = t;
    __syncthreads();
    out[blockIdx.x * blockDim.x + t] = s[t];   // USE
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_uninitialised_shared_read(order, no_hazards):
    k, code = kernel(UNINIT, "half_filled")
    out = np.zeros(2 * 64, np.float32)
    reports = run_checked(k, (2,), (64,), (out, np.int32(32)), order, check="init")
    assert reports and all(r.kind == "UNINIT" for r in reports)
    assert reports[0].line == line_of(code, "USE") and reports[0].thread[0] >= 32
    assert "initcheck" in reports[0].describe()
    assert run_checked(k, (2,), (64,), (out, np.int32(64)), order) == []


# --- llm.c's original patterns, fixed in our catalogue, are flagged ----------------------------

LLMC_PATTERNS = {
    # softmax_forward version 4 and attention_forward version 3 (its softmax): one shared slot for
    # the max, then reused for the sum with no barrier after every thread read the max.
    "softmax_slot_reuse": r"""
extern "C" __global__ void k(const float* x, float* y) {
    extern __shared__ float shared[];
    int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, warps = blockDim.x / 32;
    float v = x[blockIdx.x * blockDim.x + tid];
    float m = v;
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_down_sync(0xffffffffu, m, o));
    if (lane == 0) shared[warp] = m;
    __syncthreads();
    if (tid == 0) { float a = shared[0]; for (int i = 1; i < warps; i++) a = fmaxf(a, shared[i]); shared[0] = a; }
    __syncthreads();
    float offset = shared[0];                      // FIRST
    float e = expf(v - offset), s = e;
    for (int o = 16; o > 0; o /= 2) s += __shfl_down_sync(0xffffffffu, s, o);
    if (lane == 0) shared[warp] = s;               // SECOND
    __syncthreads();
    if (tid == 0) { float a = shared[0]; for (int i = 1; i < warps; i++) a += shared[i]; shared[0] = a; }
    __syncthreads();
    y[blockIdx.x * blockDim.x + tid] = e / shared[0];
}
""",
    # attention_backward version 7: warp 0 zeroes the slots while other warps write partials.
    "zero_slots_without_barrier": r"""
extern "C" __global__ void k(const float* x, float* y) {
    __shared__ float slots[32];
    int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    float v = x[blockIdx.x * blockDim.x + tid];
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (warp == 0) slots[lane] = 0.0f;             // FIRST
    if (lane == 0) slots[warp] = v;                // SECOND
    __syncthreads();
    if (tid == 0) { float a = 0; for (int i = 0; i < 32; i++) a += slots[i]; y[blockIdx.x] = a; }
}
""",
    # attention_backward version 8: the slots are reused for the next row with no barrier after
    # the broadcast read of the previous row's result.
    "slots_reused_for_next_row": r"""
extern "C" __global__ void k(const float* x, float* y) {
    __shared__ float slots[32];
    int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, warps = blockDim.x / 32;
    for (int row = 0; row < 4; row++) {
        float v = x[row * blockDim.x + tid];
        for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) slots[warp] = v;            // SECOND
        __syncthreads();
        if (warp == 0) {
            float a = lane < warps ? slots[lane] : 0.0f;
            for (int o = 16; o > 0; o /= 2) a += __shfl_xor_sync(0xffffffffu, a, o);
            if (lane == 0) slots[0] = a;
        }
        __syncthreads();
        y[row * blockDim.x + tid] = slots[0];      // FIRST
    }
}
""",
    # classifier_fused version 3, in place: thread 0 reads the target's logit for the loss after
    # the reductions while other threads already overwrite the logits with gradients.
    "in_place_loss_read": r"""
extern "C" __global__ void k(const float* unused, float* logits) {
    int tid = threadIdx.x, V = 256, target = 77;
    float* row = logits + blockIdx.x * V;
    __shared__ float total;
    if (tid == 0) total = 0.0f;
    __syncthreads();
    for (int i = tid; i < V; i += blockDim.x) atomicAdd(&total, expf(row[i]));
    __syncthreads();
    float scale = 1.0f / total;
    for (int i = tid; i < V; i += blockDim.x) row[i] = expf(row[i]) * scale - (i == target);  // SECOND
    if (tid == 0) row[V] = -logf(expf(row[target]) * scale);                                  // FIRST
}
""",
}


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("pattern", sorted(LLMC_PATTERNS))
def test_llmc_original_race_patterns_are_flagged(pattern, order, no_hazards):
    k, code = kernel(LLMC_PATTERNS[pattern], "k")
    x = np.random.default_rng(0).standard_normal(4 * 128).astype(np.float32)
    if pattern == "in_place_loss_read":
        args, grid = (x, np.concatenate([x[:256], np.zeros(1, np.float32)])), (1,)
    else:
        args, grid = (x, np.zeros(4 * 128, np.float32)), (1,)
    reports = run_checked(k, grid, (128,), args, order, check="race",
                          shared_mem=4 * 4 if pattern == "softmax_slot_reuse" else 0)
    races = [r for r in reports if r.kind in ("RAW", "WAR", "WAW")]
    assert races, f"{pattern}: llm.c's race was not flagged in order {order}"
    lines = {line_of(code, "FIRST"), line_of(code, "SECOND")}
    assert any({r.line, r.prev_line} == lines for r in races), [r.describe() for r in races]


def test_sanitizer_error_message_lists_each_line_pair_once(no_hazards):
    k, code = kernel(TREE, "tree")
    x = np.arange(256, dtype=np.float32)
    with sim.settings(check="race"), pytest.raises(sim.SimSanitizerError) as info:
        k((4,), (256,), (x, np.zeros(4, np.float32), np.int32(64)))
    message = str(info.value)
    assert message.startswith("tree: the sanitizers found")
    assert message.count("racecheck:") == len({(r.kind, r.line, r.prev_line) for r in info.value.reports})
    assert isinstance(info.value, sim.SimLaunchError)


def test_plain_launches_fault_at_an_arrays_end_instead_of_writing_past_it(no_hazards):
    # without the sanitizers the emulator checks no access (the default, full speed), but the launch
    # runs on a fenced copy of each allocation: the stray write faults instead of landing in full[32]
    k, _ = kernel(OOB, "spill")
    full = np.zeros(48, np.float32)
    out = _standalone(full, 32)
    with sim.settings(check=""):
        with pytest.raises(sim.SimMemoryFaultError, match=r"in block \(0,0,0\), thread \(5,0,0\): an out-of-bounds "
                                                          r"memory access at 0x[0-9a-f]+, 0 bytes past the end of "
                                                          r"argument 0 \(a 128-byte allocation\)"):
            k((1,), (32,), (out, np.int32(29)))  # thread 5 writes out[32], one past the array's end
    assert not full[32:].any()


DEVICE_VARS = r"""
__constant__ float scale[2];
__device__ int hits;
extern "C" __global__ void scaled(float* y) {
    y[threadIdx.x] = scale[0] * threadIdx.x;
    if (threadIdx.x == 0) hits = 5;
}
extern "C" __global__ void poke(int* p) { *p = 9; }
"""


def test_device_variables_are_memory_of_the_launch_and_keep_their_values(no_hazards):
    mod = llmcupy.RawModule(code=DEVICE_VARS, target="sim")
    mod.global_array("scale", np.float32)[:] = [3.0, 0.0]
    y = np.zeros(32, np.float32)
    with sim.settings(check="all"):
        mod.get_function("scaled")((1,), (32,), (y,))
    np.testing.assert_array_equal(y, 3.0 * np.arange(32, dtype=np.float32))
    assert mod.global_array("hits", np.int32)[0] == 5  # written by the instrumented build, seen here
    hits = mod.global_array("hits", np.int32)
    with sim.settings(check="all"):  # through a pointer into the plain build's variable: kept
        mod.get_function("poke")((1,), (1,), (hits,))
    assert hits[0] == 9


CP_ASYNC = r"""
#include <cuda_pipeline.h>
extern "C" __global__ void stage(const float* src, float* out, int off) {
    __shared__ __align__(16) float s[32];
    __pipeline_memcpy_async(&s[threadIdx.x], src + threadIdx.x + off, 4);   // COPY
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    out[threadIdx.x] = s[31 - threadIdx.x];
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_cp_async_copies_are_checked_and_count_as_writes(order, no_hazards):
    k, code = kernel(CP_ASYNC, "stage")
    full = np.arange(48, dtype=np.float32)
    src = _standalone(full, 32)
    out = np.zeros(32, np.float32)
    # in bounds: the copies initialise s (initcheck is quiet) and the barrier orders them (racecheck)
    assert run_checked(k, (1,), (32,), (src, out, np.int32(0)), order) == []
    np.testing.assert_array_equal(out, src[::-1])
    reports = run_checked(k, (1,), (32,), (src, out, np.int32(16)), order, check="memory")
    assert len(reports) == 1 and reports[0].kind == "OOB" and not reports[0].write
    assert reports[0].line == line_of(code, "COPY") and reports[0].thread[0] >= 16


def test_kernel_cli_sanitize(capsys, tmp_path):
    from llmcupy import kernel as cli

    path = tmp_path / "r.json"
    assert cli.main(["softmax_forward", "4", "--backend", "sim", "--sanitize", "--block-size", "64",
                     "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "sanitizers: racecheck, memcheck, initcheck: no findings" in out
    assert json.loads(path.read_text())[0]["sanitizers"] == ["racecheck", "memcheck", "initcheck"]
    assert cli.main(["softmax_forward", "4", "--backend", "sim", "--sanitize", "race", "--block-size", "64"]) == 0
    assert "sanitizers: racecheck: no findings" in capsys.readouterr().out
    assert cli.main(["softmax_forward", "4", "--backend", "sim", "--block-size", "64", "--json", str(path)]) == 0
    assert "sanitizers" not in capsys.readouterr().out and "sanitizers" not in json.loads(path.read_text())[0]
    assert cli.main(["softmax_forward", "4", "--backend", "sim", "--sanitize", "rase"]) == 2
    assert "unknown sanitizer 'rase'" in capsys.readouterr().err
    # before: an empty value ran no check and printed PASS as if checked
    for empty in ("", " ", ","):
        assert cli.main(["softmax_forward", "4", "--backend", "sim", "--sanitize", empty]) == 2
        assert "--sanitize '' names no check" in capsys.readouterr().err
    assert cli.main(["softmax_forward", "4", "--backend", "sim", "--sanitize", "none", "--block-size", "64"]) == 0
    assert "sanitizers" not in capsys.readouterr().out


def test_plain_and_checked_builds_are_separate_libraries(no_hazards):
    mod = llmcupy.RawModule(code=textwrap.dedent(OOB), target="sim")
    plain = mod._sim_library
    checked = plain.checked()
    assert checked.path != plain.path and checked.path.name.endswith("-check.so")
    # the plain build has no hooks at all: nothing of the checker is linked into it
    assert not hasattr(plain._lib, "llmcupy_sim_check_reports")
    assert hasattr(checked._lib, "llmcupy_sim_check_reports")


SHARED_FORMS = r"""
#include <cub/block/block_reduce.cuh>
extern "C" __global__ void forms(const float* in, float* out) {
    __shared__ float a[64], b[64];                     // two arrays in one declaration
    typedef cub::BlockReduce<float, 64> BlockReduce;
    __shared__ typename BlockReduce::TempStorage temp;  // a template type
    int t = threadIdx.x;
    a[t] = in[t];
    b[t] = 2.0f * in[t];
    __syncthreads();
    float total = BlockReduce(temp).Sum(a[63 - t] + b[t]);
    if (t == 0) out[blockIdx.x] = total;
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_every_shared_declaration_form_is_known_to_the_checks(order, no_hazards):
    # each declarator and template-typed storage is a registered shared array: memcheck knows it,
    # racecheck and initcheck shadow it (an unregistered one would read as a wild address)
    k, _ = kernel(SHARED_FORMS, "forms")
    x = np.arange(64, dtype=np.float32)
    out = np.zeros(2, np.float32)
    assert run_checked(k, (2,), (64,), (x, out), order) == []
    np.testing.assert_array_equal(out, 3 * x.sum())


LEGACY_WARP = r"""
extern "C" __global__ void legacy(const float* in, float* out) {
    __shared__ float s[64];
    int t = threadIdx.x;
    s[t] = in[t];
    __syncthreads();
    if (t < 32) {
        volatile float* v = s;
        v[t] += v[t + 32];
        v[t] += v[t + 16];                // pre-Volta warp-synchronous style: no __syncwarp between
    }
    if (t == 0) out[0] = s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7] + s[8] + s[9] + s[10] + s[11] + s[12] + s[13] + s[14] + s[15];
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_legacy_volatile_warp_synchronous_code_is_a_warp_synchronous_hazard(order, no_hazards):
    # volatile sources yield at every volatile access (lock-step) and are checked all the same
    k, _ = kernel(LEGACY_WARP, "legacy")
    x = np.arange(64, dtype=np.float32)
    out = np.zeros(1, np.float32)
    reports = run_checked(k, (1,), (64,), (x, out), order, check="race")
    assert reports and all(r.warp_synchronous for r in reports)
