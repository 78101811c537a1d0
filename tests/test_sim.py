"""The emulator's CUDA semantics and hazard detection, kernel by kernel."""

import faulthandler
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import types
import warnings

import numpy as np
import pytest

import llmcupy
from llmcupy import sim
from llmcupy.harness import run_isolated

ORDERS = ("forward", "reverse", "random")


def module(code, **kw):
    return llmcupy.RawModule(code=textwrap.dedent(code), target="sim", **kw)


WARP_CODE = r"""
__global__ void shuffles(int* out) {
    int lane = threadIdx.x % 32;
    int v = lane * 10;
    int base = (threadIdx.x / 32) * 32 * 6 + lane;
    out[base + 0] = __shfl_sync(0xffffffff, v, 3);
    out[base + 32] = __shfl_up_sync(0xffffffff, v, 2);
    out[base + 64] = __shfl_down_sync(0xffffffff, v, 5);
    out[base + 96] = __shfl_xor_sync(0xffffffff, v, 1);
    out[base + 128] = __shfl_down_sync(0xffffffff, v, 1, 8);   // segments of 8 lanes
    out[base + 160] = (int)__ballot_sync(0xffffffff, lane % 3 == 0) + __any_sync(0xffffffff, lane == 7) * 7
                      + __all_sync(0xffffffff, lane < 40) * 100;
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_warp_shuffles_and_votes(order, no_hazards):
    out = np.zeros(2 * 32 * 6, np.int32)
    with sim.settings(order=order, seed=3):
        module(WARP_CODE).get_function("shuffles")((1,), (64,), (out,))
    lane = np.arange(32)
    v = lane * 10
    for w in range(2):
        o = out[w * 192:(w + 1) * 192].reshape(6, 32)
        assert (o[0] == 30).all()
        assert (o[1] == np.where(lane >= 2, v - 20, v)).all()
        assert (o[2] == np.where(lane + 5 < 32, v + 50, v)).all()
        assert (o[3] == (lane ^ 1) * 10).all()
        assert (o[4] == np.where(lane % 8 < 7, v + 10, v)).all()
        ballot = sum(1 << l for l in range(32) if l % 3 == 0)
        assert (o[5] == np.int32(np.uint32(ballot).view(np.int32)) + 7 + 100).all()


CG_CODE = r"""
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;
struct __align__(8) Pair { float a; float b; };
struct PairMax { __device__ Pair operator()(Pair x, Pair y) const { return x.a > y.a ? x : y; } };
__global__ void groups(float* out, int* meta) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<16> tile = cg::tiled_partition<16>(block);
    int t = block.thread_rank();
    float v = (float)t;
    float s = cg::reduce(tile, v, cg::plus<float>());
    float m = cg::reduce(tile, v, cg::greater<float>());
    Pair p; p.a = (float)((t * 7) % 16); p.b = (float)t;
    Pair best = cg::reduce(tile, p, PairMax());
    out[t * 3 + 0] = s;
    out[t * 3 + 1] = m;
    out[t * 3 + 2] = best.b;
    meta[t * 3 + 0] = tile.thread_rank();
    meta[t * 3 + 1] = tile.meta_group_rank();
    meta[t * 3 + 2] = tile.meta_group_size();
    tile.sync();
    block.sync();
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_cooperative_groups_tiles_and_reduce(order, no_hazards):
    out = np.zeros(64 * 3, np.float32)
    meta = np.zeros(64 * 3, np.int32)
    with sim.settings(order=order):
        module(CG_CODE).get_function("groups")((1,), (64,), (out, meta))
    t = np.arange(64)
    tile = t // 16
    out = out.reshape(64, 3)
    meta = meta.reshape(64, 3)
    sums = np.array([np.arange(16 * k, 16 * k + 16).sum() for k in range(4)])
    assert (out[:, 0] == sums[tile]).all()
    assert (out[:, 1] == 16 * tile + 15).all()
    for k in range(4):
        members = np.arange(16 * k, 16 * k + 16)
        best = members[np.argmax((members * 7) % 16)]
        assert (out[members, 2] == best).all()
    assert (meta[:, 0] == t % 16).all() and (meta[:, 1] == tile).all() and (meta[:, 2] == 4).all()


GRID_CODE = r"""
__global__ void where(int* out) {
    int bx = blockIdx.x, by = blockIdx.y, bz = blockIdx.z;
    int tx = threadIdx.x, ty = threadIdx.y, tz = threadIdx.z;
    int block = (bz * gridDim.y + by) * gridDim.x + bx;
    int thread = (tz * blockDim.y + ty) * blockDim.x + tx;
    out[block * blockDim.x * blockDim.y * blockDim.z + thread] = block * 1000 + thread;
}
__global__ void counter(float* total, unsigned int* hits) {
    atomicAdd(total, 0.5f);
    atomicAdd(hits, 1u);
}
__global__ void wrapping(unsigned int* counters) {
    atomicInc(counters, 9u);        // counts 0..9 then wraps to 0
    atomicDec(counters + 1, 9u);
    atomicMax((int*)counters + 2, (int)threadIdx.x);
}
"""


def test_wrapping_counters_and_integer_atomics(no_hazards):
    counters = np.zeros(3, np.uint32)
    module(GRID_CODE).get_function("wrapping")((1,), (25,), (counters,))
    assert counters[0] == 25 % 10 and counters[1] == (0 - 25) % 10 and counters[2] == 24


def test_3d_grid_and_block_indices(no_hazards):
    out = np.full(2 * 3 * 2 * 4 * 2 * 3, -1, np.int32)
    module(GRID_CODE).get_function("where")((2, 3, 2), (4, 2, 3), (out,))
    expect = np.array([b * 1000 + t for b in range(12) for t in range(24)])
    assert (out == expect).all()


@pytest.mark.parametrize("workers", [1, 2])
def test_float_atomics_across_blocks(workers, no_hazards):
    total = np.zeros(1, np.float32)
    hits = np.zeros(1, np.uint32)
    with sim.settings(workers=workers):
        module(GRID_CODE).get_function("counter")((50,), (128,), (total, hits))
    assert hits[0] == 6400 and total[0] == 3200.0


SHARED_CODE = r"""
template <typename T, int N>
__global__ __launch_bounds__(256) void blocksum(T* __restrict__ out, const T* __restrict__ inp, int n) {
    extern __shared__ float scratch[];
    __shared__ T partial[N];
    int t = threadIdx.x;
    T v = 0;
    for (int i = t; i < n; i += blockDim.x) v += __ldcs(inp + i);
    scratch[t] = (float)v;
    __syncthreads();
    if (t < N) {
        T acc = 0;
        for (int i = t; i < (int)blockDim.x; i += N) acc += (T)scratch[i];
        partial[t] = acc;
    }
    __syncthreads();
    if (t == 0) {
        T acc = 0;
        for (int i = 0; i < N; i++) acc += partial[i];
        __stcs(out, acc);
    }
}
__global__ void racy(float* out) {
    __shared__ float s[64];
    s[threadIdx.x] = threadIdx.x;
    out[threadIdx.x] = s[(threadIdx.x + 1) % 64];   // missing __syncthreads()
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_templates_static_and_dynamic_shared_memory(order, no_hazards):
    mod = module(SHARED_CODE, name_expressions=["blocksum<float, 8>", "blocksum<double, 4>"])
    x = np.arange(1000, dtype=np.float32)
    out = np.zeros(1, np.float32)
    with sim.settings(order=order):
        mod.get_function("blocksum<float, 8>")((1,), (256,), (out, x, np.int32(1000)), shared_mem=256 * 4)
    assert out[0] == x.sum()
    xd = np.arange(100, dtype=np.float64)
    outd = np.zeros(1, np.float64)
    mod.get_function("blocksum<double, 4>")((1,), (64,), (outd, xd, np.int32(100)), shared_mem=64 * 4)
    assert outd[0] == xd.sum()


def test_shared_memory_poison_exposes_a_missing_barrier():
    mod = module(SHARED_CODE)
    out = np.zeros(64, np.float32)
    with sim.settings(order="forward"):
        mod.get_function("racy")((1,), (64,), (out,))
    # in forward order thread i reads slot i+1 before thread i+1 wrote it: the poison shows
    assert np.isnan(out[:63]).all()
    with sim.settings(order="reverse"):
        mod.get_function("racy")((1,), (64,), (out,))
    assert np.isnan(out[63]) and (out[:63] == np.arange(1, 64)).all()


HAZARD_CODE = r"""
__global__ void divergent(float* out) {
    if (threadIdx.x < 32) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1.0f;
}
__global__ void exit_then_barrier(float* out, int n) {
    if (threadIdx.x >= n) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}
__global__ void read_exited_lane(float* out, int n) {
    if (threadIdx.x >= n) return;
    float v = __shfl_down_sync(0xffffffff, 1.0f, 16);
    out[threadIdx.x] = v;
}
__global__ void deadlock(float* out) {
    if (threadIdx.x < 5) __syncthreads(); else __syncwarp();
}
"""


def test_hazard_counters():
    # a launch that finds a hazard also warns, naming the kernel (before: only the counters, which
    # only the tests read: a learner's barrier inside `if` ran without a word)
    mod = module(HAZARD_CODE)
    out = np.zeros(64, np.float32)
    sim.reset_hazards()
    with pytest.warns(sim.SimHazardWarning, match=r"^divergent: 1 __syncthreads\(\) released while threads of a "
                                                   r"block waited at different calls of it \(divergent_barriers\)"):
        mod.get_function("divergent")((1,), (64,), (out,))
    assert sim.hazards()["divergent_barriers"] == 1
    sim.reset_hazards()
    with pytest.warns(sim.SimHazardWarning, match=r"^exit_then_barrier: 1 __syncthreads\(\) that some threads of "
                                                   r"the block never reached"):
        mod.get_function("exit_then_barrier")((1,), (64,), (out, np.int32(40)))
    assert sim.hazards()["barrier_after_exit"] == 1
    sim.reset_hazards()
    with pytest.warns(sim.SimHazardWarning, match=r"^read_exited_lane: 12 warp collective\(s\) reading a lane"):
        mod.get_function("read_exited_lane")((1,), (32,), (out, np.int32(20)))
    assert sim.hazards()["exited_lane_reads"] == 12  # lanes 4-15 read lanes 20-31, which returned
    sim.reset_hazards()
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # a clean launch says nothing
        mod.get_function("exit_then_barrier")((1,), (64,), (out, np.int32(64)))


def test_deadlock_is_an_error_naming_lines():
    mod = module(HAZARD_CODE)
    with pytest.raises(sim.SimDeadlockError) as info:
        mod.get_function("deadlock")((1,), (64,), (np.zeros(64, np.float32),))
    text = str(info.value)
    assert "deadlock in kernel deadlock" in text
    line = textwrap.dedent(HAZARD_CODE).splitlines().index("    if (threadIdx.x < 5) __syncthreads(); else __syncwarp();") + 1
    assert f"threads 0-4 wait at __syncthreads (line {line})" in text
    assert f"threads 5-31 wait at __syncwarp (line {line})" in text


def test_argument_checks_name_kernel_and_argument():
    mod = module(SHARED_CODE + HAZARD_CODE)
    k = mod.get_function("exit_then_barrier")
    out = np.zeros(64, np.float32)
    with pytest.raises(llmcupy.KernelArgumentError, match=r"exit_then_barrier: argument 1 \(int n\): got a Python int"):
        k((1,), (64,), (out, 40))
    with pytest.raises(llmcupy.KernelArgumentError, match=r"argument 1 \(int n\): expected np.int32, got np.int64"):
        k((1,), (64,), (out, np.int64(40)))
    with pytest.raises(llmcupy.KernelArgumentError, match=r"argument 0 \(float\* out\): expected an array of float32"):
        k((1,), (64,), (out.astype(np.float64), np.int32(4)))
    with pytest.raises(llmcupy.KernelArgumentError, match="not C-contiguous"):
        k((1,), (64,), (np.zeros((8, 16), np.float32)[:, ::2], np.int32(4)))
    readonly = np.zeros(64, np.float32)
    readonly.flags.writeable = False
    with pytest.raises(llmcupy.KernelArgumentError, match="read-only"):
        k((1,), (64,), (readonly, np.int32(4)))
    with pytest.raises(llmcupy.KernelArgumentError, match="takes 2 argument"):
        k((1,), (64,), (out,))
    with pytest.raises(llmcupy.KernelArgumentError, match="exceeds CUDA's limit of 1024"):
        k((1,), (2048,), (out, np.int32(4)))
    # per-dimension limits a GPU refuses ("invalid argument") even when the total is allowed
    with pytest.raises(llmcupy.KernelArgumentError, match=r"exit_then_barrier: grid y = 65536 exceeds CUDA's limit "
                       r"of 65535"):
        k((1, 65536), (64,), (out, np.int32(4)))
    with pytest.raises(llmcupy.KernelArgumentError, match=r"exit_then_barrier: block z = 65 exceeds CUDA's limit of 64"):
        k((1,), (1, 1, 65), (out, np.int32(4)))
    # (out) is out, not a tuple: it would be taken element by element, "64 were given"
    with pytest.raises(llmcupy.KernelArgumentError, match=r"exit_then_barrier: args must be a tuple of its 2 "
                       r"argument\(s\) \(float\* out, int n\), got ndarray; a single argument is written \(x,\)"):
        k((1,), (64,), out)
    # n / 64 is a float: truncated, it would launch too few blocks
    with pytest.raises(llmcupy.KernelArgumentError, match=r"exit_then_barrier: grid must be ints, got \(1.5,\); "
                       r"for a count of blocks write \(n \+ block - 1\) // block"):
        k((96 / 64,), (64,), (out, np.int32(4)))
    with pytest.raises(llmcupy.KernelArgumentError, match=r"block must be ints"):
        k(1, 64.0, (out, np.int32(4)))


def test_a_kernel_name_that_is_not_in_the_source_is_named():
    code = "__global__ void scale(float* y, int n) { if (threadIdx.x < n) y[threadIdx.x] *= 2.0f; }\n"
    with pytest.raises(AttributeError, match=r"no kernel 'scal' in kernel.cu \(did you mean 'scale'\?\); kernels: scale"):
        llmcupy.RawKernel(code, "scal", target="sim")      # (was g++'s error in generated code)
    with pytest.raises(AttributeError, match=r"no kernel 'scal' in kernel.cu \(did you mean 'scale'\?\); kernels: scale"):
        module(code).get_function("scal")


def test_a_misspelt_kernel_name_is_matched_among_many():
    # A launcher's typo in a catalogue file: the error listed nine near-identical names and left the
    # reader to find the one meant; now it says which
    code = "".join(f"__global__ void softmax_forward_online_kernel{n}(float* y) {{}}\n" for n in range(1, 10))
    with pytest.raises(AttributeError, match=r"no kernel 'softmax_forward_online_kernl9' in kernel.cu \(did you mean "
                                             r"'softmax_forward_online_kernel9'\?\); kernels: softmax_forward_online_kernel1, "):
        module(code).get_function("softmax_forward_online_kernl9")
    with pytest.raises(AttributeError, match=r"no kernel 'gelu' in kernel.cu; kernels: "):   # nothing close: no guess
        module(code).get_function("gelu")


def test_a_misspelt_kernel_name_on_a_gpu_is_named_too():
    # On a GPU the name reached the driver's lookup, whose error was "CUDA_ERROR_NOT_FOUND: named symbol
    # not found" with neither the name nor the choices. Stood in by a module whose CuPy lookup fails so.
    class NotFound(Exception):
        pass

    def lookup(name):
        raise NotFound("CUDA_ERROR_NOT_FOUND: named symbol not found")

    mod = object.__new__(llmcupy.RawModule)
    mod.backend, mod.filename, mod._functions, mod.enable_cooperative_groups = "cuda", "softmax_forward.cu", {}, False
    mod.cuda_name_expressions = [f"softmax_forward_online_kernel{n}" for n in range(1, 10)]
    mod._cupy_module = types.SimpleNamespace(get_function=lookup)
    with pytest.raises(AttributeError, match=r"no kernel 'softmax_forward_online_kernl9' in softmax_forward.cu \(did "
                                             r"you mean 'softmax_forward_online_kernel9'\?\); kernels: "):
        mod.get_function("softmax_forward_online_kernl9")
    with pytest.raises(NotFound):   # a name it was given: the driver's own error stands
        mod.get_function("softmax_forward_online_kernel9")


def test_a_name_expression_that_names_no_kernel_on_a_gpu_is_named_too(monkeypatch):
    # CuPy compiles at the first lookup, and NVRTC refuses a name expression that names nothing
    # ('identifier "scal" is undefined' in its name map): RawKernel(code, "scal") raised CuPy's
    # CompileException on a GPU where the emulator says which name and the kernel it likely meant.
    # Stood in by CuPy's own CompileException (CuPy imports without a GPU) from the lookup.
    compiler = pytest.importorskip("cupy.cuda.compiler")
    code = "__global__ void scale(float* y, int n) { if (threadIdx.x < n) y[threadIdx.x] *= 2.0f; }\n"
    refused = compiler.CompileException('__nv_name_map(2): error: identifier "scal" is undefined', code,
                                        "kernel.cu", ())

    def fake_cupy_module(**kwargs):
        def lookup(name):
            raise refused
        return types.SimpleNamespace(get_function=lookup)

    monkeypatch.setattr(llmcupy.runtime.module.sim_compiler, "include_digest", lambda *a: "")
    cupy = pytest.importorskip("cupy")
    monkeypatch.setattr(cupy, "RawModule", fake_cupy_module)
    with pytest.raises(AttributeError, match=r"^no kernel 'scal' in kernel.cu \(did you mean 'scale'\?\); kernels: scale$"):
        llmcupy.RawKernel(code, "scal", target="cuda")
    with pytest.raises(AttributeError, match=r"^no kernel 'scal' in kernel.cu \(did you mean 'scale'\?\)"):
        llmcupy.RawModule(code=code, name_expressions=["scal"], target="cuda").get_function("scale")
    with pytest.raises(compiler.CompileException):   # every name is declared: NVRTC's own error stands
        llmcupy.RawModule(code=code, target="cuda").get_function("scale")


def test_vector_pointer_alignment_is_checked():
    mod = module(r"""
    __global__ void copy4(float4* out, const float4* inp, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) out[i] = inp[i];
    }
    """)
    k = mod.get_function("copy4")
    x = np.arange(64, dtype=np.float32)
    out = np.zeros(64, np.float32)
    k((1,), (16,), (out, x, np.int32(16)))
    assert (out == x).all()
    with pytest.raises(llmcupy.KernelArgumentError, match="not 16-byte aligned"):
        k((1,), (16,), (out, x[1:61], np.int32(15)))


def test_half_bfloat16_and_vector_arguments_are_checked(no_hazards):
    # before: a __half*, __nv_bfloat16* or uint4* parameter took any array (float32 data read as
    # halves: wrong results without a word), a misaligned uint4 array (a GPU faults) and a float32
    # scalar for a __half (2 of its 4 bytes); the signature showed them as '?'
    mod = module(r"""
    #include <cuda_fp16.h>
    #include <cuda_bf16.h>
    __global__ void axpy(half* y, const __half* x, __half a) {
        y[threadIdx.x] = __hadd(y[threadIdx.x], __hmul(a, x[threadIdx.x]));
    }
    __global__ void widen(float* y, const __nv_bfloat16* x) { y[threadIdx.x] = __bfloat162float(x[threadIdx.x]); }
    __global__ void ones(uint4* y) { y[threadIdx.x] = make_uint4(1, 1, 1, 1); }
    """)
    axpy, widen, ones = (mod.get_function(n) for n in ("axpy", "widen", "ones"))
    assert axpy.signature == "axpy(__half* y, const __half* x, __half a)"
    assert widen.signature == "widen(float* y, const __nv_bfloat16* x)"
    y, x = np.ones(4, np.float16), np.arange(4, dtype=np.float16)
    axpy((1,), (4,), (y, x, np.float16(0.5)))
    assert y.tolist() == [1.0, 1.5, 2.0, 2.5]
    with pytest.raises(llmcupy.KernelArgumentError, match=r"axpy: argument 1 \(const __half\* x\): expected an array "
                                                          r"of float16, got float32"):
        axpy((1,), (4,), (y, x.astype(np.float32), np.float16(0.5)))
    with pytest.raises(llmcupy.KernelArgumentError, match=r"argument 2 \(__half a\): expected np.float16, got "
                                                          r"np.float32"):
        axpy((1,), (4,), (y, x, np.float32(0.5)))
    f = np.zeros(2, np.float32)
    widen((1,), (2,), (f, np.array([1.5, -2.0], np.float32).view(np.uint16)[1::2].copy()))  # the upper halves
    assert f.tolist() == [1.5, -2.0]
    with pytest.raises(llmcupy.KernelArgumentError, match=r"expected an array of uint16 or bfloat16, got float16"):
        widen((1,), (2,), (f, np.zeros(2, np.float16)))
    u = np.zeros(9, np.uint32)
    with pytest.raises(llmcupy.KernelArgumentError, match=r"ones: argument 0 \(uint4\* y\): address .* is not "
                                                          r"16-byte aligned"):
        ones((1,), (2,), (u[1:],))
    with pytest.raises(llmcupy.KernelArgumentError, match=r"expected an array of uint32, got float32"):
        ones((1,), (2,), (np.zeros(8, np.float32),))


def test_a_struct_passed_by_value_takes_a_structured_scalar_of_its_size(no_hazards):
    # before: any NumPy scalar was taken for a struct parameter and the kernel read the struct's size
    # from it: np.float32(2) for a 12-byte struct read 8 bytes past it (a wrong n, then a fault), and
    # a dtype without align=True (5 bytes for {char; float}) gave the float from the wrong bytes;
    # the signature showed the struct as '?'
    mod = module(r"""
    struct Params { float a; int n; float b; };
    struct Mixed { char c; float f; };
    __global__ void axpb(Params p, const float* x, float* y) {
        int i = threadIdx.x;
        if (i < p.n) y[i] = p.a * x[i] + p.b;
    }
    __global__ void take(Mixed m, float* out) { out[0] = m.f; out[1] = m.c; }
    """)
    axpb, take = mod.get_function("axpb"), mod.get_function("take")
    assert axpb.signature == "axpb(Params p, const float* x, float* y)"
    params = np.dtype([("a", np.float32), ("n", np.int32), ("b", np.float32)], align=True)
    x, y = np.arange(8, dtype=np.float32), np.zeros(8, np.float32)
    axpb((1,), (32,), (np.array([(2.0, 6, 1.0)], params)[0], x, y))
    assert y.tolist() == [1, 3, 5, 7, 9, 11, 0, 0]
    with pytest.raises(llmcupy.KernelArgumentError,
                       match=r"axpb: argument 0 \(Params p\): the kernel takes 12 bytes here, got 4 \(np.float32\); "
                             r"pass a NumPy scalar of that type and size \(for a struct, a NumPy structured scalar"):
        axpb((1,), (32,), (np.float32(2), x, y))
    with pytest.raises(llmcupy.KernelArgumentError, match=r"argument 0 \(Params p\): cannot pass int for C type "
                                                          r"Params; pass a NumPy scalar of that type"):
        axpb((1,), (32,), (2, x, y))
    out = np.zeros(2, np.float32)
    packed = np.dtype([("c", np.int8), ("f", np.float32)])
    with pytest.raises(llmcupy.KernelArgumentError, match=r"takes 8 bytes here, got 5 .*align=True"):
        take((1,), (1,), (np.array([(3, 2.5)], packed)[0], out))
    take((1,), (1,), (np.array([(3, 2.5)], np.dtype(packed.descr, align=True))[0], out))
    assert out.tolist() == [2.5, 3.0]


STATIC_SHARED = r"""
__global__ void big(float* y) {
    __shared__ float s[N];
    __shared__ float t[32];
    s[threadIdx.x] = t[threadIdx.x] = 1.0f;
    __syncthreads();
    y[threadIdx.x] = s[N - 1 - threadIdx.x] + t[threadIdx.x];
}
"""


def test_more_static_shared_memory_than_a_gpu_allows_is_refused(no_hazards):
    # before: 80 KB of __shared__ arrays ran in the emulator; ptxas refuses any kernel past 48 KiB
    y = np.zeros(32, np.float32)
    module(STATIC_SHARED, options=("-DN=12256",)).get_function("big")((1,), (32,), (y,))   # 48 KiB exactly
    with pytest.raises(sim.SimSharedMemoryError, match=r"kernel big declares 49156 bytes of static shared memory "
                                                       r"\(the largest: 's', line 3, 49028 bytes\), more than the "
                                                       r"48 KiB \(49152 bytes\) a GPU allows"):
        module(STATIC_SHARED, options=("-DN=12257",)).get_function("big")((1,), (32,), (y,))


def test_the_static_shared_memory_limit_is_ptxas_limit(have_nvrtc):
    from llmcupy import nvrtc

    assert nvrtc.compile_source(STATIC_SHARED.replace("N", "12256"), 80).ok
    result = nvrtc.compile_source(STATIC_SHARED.replace("N", "12257"), 80)
    assert not result.ok and "49156 bytes smem" in result.log and "NVRTC_ERROR_COMPILATION" in result.log


CONSTANT_TABLES = r"""
namespace tables { __constant__ char tag; }
__constant__ float weights[N];
__global__ void lookup(float* out) { out[threadIdx.x] = weights[threadIdx.x] + tables::tag; }
"""


def test_more_constant_memory_than_a_gpu_holds_is_refused(no_hazards):
    # before: 80 KB of __constant__ tables ran in the emulator; NVRTC fails the compile past the 64 KiB
    # constant bank
    out = np.zeros(32, np.float32)
    module(CONSTANT_TABLES, options=("-DN=16383",)).get_function("lookup")((1,), (32,), (out,))   # 65533 bytes
    with pytest.raises(sim.SimCompileError, match=r"tables.cu:2:.*the __constant__ variables \(tables::tag, weights\) "
                                                  r"hold more than the 64 KiB \(65536 bytes\) of a GPU's constant bank "
                                                  r"\(NVRTC refuses it too.*pass it as a const pointer argument"):
        module(CONSTANT_TABLES, options=("-DN=16384",), filename="tables.cu")


def test_the_constant_memory_limit_is_ptxas_limit(have_nvrtc):
    from llmcupy import nvrtc

    assert nvrtc.compile_source(CONSTANT_TABLES.replace("[N]", "[16383]"), 80).ok
    result = nvrtc.compile_source(CONSTANT_TABLES.replace("[N]", "[16384]"), 80)
    assert not result.ok and "65537 bytes cmem[3]" in result.log and "NVRTC_ERROR_COMPILATION" in result.log


def test_fast_math_intrinsics_and_ucontext_fallback(no_hazards):
    code = r"""
    __global__ void maths(float* out, const float* x) {
        int i = threadIdx.x;
        out[i] = __expf(x[i]) + __fdividef(x[i], 2.0f) + rsqrtf(x[i] + 2.0f) + tanhf(x[i]) + __logf(x[i] + 2.0f);
        __syncthreads();
    }
    """
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    expect = np.exp(x) + x / 2 + 1 / np.sqrt(x + 2) + np.tanh(x) + np.log(x + 2)
    for options in ((), ("-DLLMCUPY_SIM_UCONTEXT",)):
        out = np.zeros(64, np.float32)
        module(code, options=options).get_function("maths")((1,), (64,), (out, x))
        np.testing.assert_allclose(out, expect, rtol=1e-6)


def test_compile_error_is_reported_with_the_line():
    with pytest.raises(sim.SimCompileError, match=r"broken.cu:3"):
        llmcupy.RawModule(code="__global__ void k(float* x) {\n\n  x[0] = undefined_name;\n}\n", target="sim",
                          filename="broken.cu")


@pytest.mark.parametrize("code, line", [
    # dynamic parallelism, as in CUDA's samples
    ("__global__ void child(int* x) { x[threadIdx.x] = 1; }\n"
     "__global__ void parent(int* x) { if (threadIdx.x == 0) child<<<1, 32>>>(x); }\n", 2),
    # a whole .cu program pasted in: host code launching the kernel
    ("__global__ void child(int* x) { x[threadIdx.x] = 1; }\n\n"
     "int main() { int* d; cudaMalloc(&d, 128); child<<<1, 32>>>(d); return 0; }\n", 3),
])
def test_a_kernel_launch_in_the_source_is_named_as_such(code, line):
    # before: only g++'s "expected primary-expression before '<' token"
    with pytest.raises(sim.SimCompileError, match=rf"line {line} launches a kernel with <<<\.\.\.>>>: a RawModule "
                                                  r"source is device code.*from Python"):
        llmcupy.RawModule(code=code, target="sim")


@pytest.mark.parametrize("code, said", [
    ("__global__ void k(cudaTextureObject_t t, float* out) { out[threadIdx.x] = tex1Dfetch<float>(t, threadIdx.x); }",
     r"'tex1Dfetch': texture objects are not emulated: pass the data as a const pointer"),
    ("__global__ void k(int* x) { int* p; cudaMalloc(&p, 4); x[0] = 1; }",
     r"'cudaMalloc': the CUDA runtime API is host code, which a RawModule source does not hold"),
    # libcu++'s async copies, the last rung of SGEMM tutorials (before: "'barrier' is not a member of
    # 'cuda'", "cuda/pipeline: No such file or directory")
    ("#include <cuda/barrier>\n__global__ void k(float* x) {\n"
     "    __shared__ cuda::barrier<cuda::thread_scope_block> bar;\n    init(&bar, blockDim.x);\n}",
     r"'cuda::barrier': libcu\+\+'s cuda::barrier, cuda::pipeline and cuda::memcpy_async are not emulated: copy "
     r"with cooperative_groups' cg::memcpy_async"),
    ("#include <cuda/pipeline>\n__global__ void k(float* x) { auto pipe = cuda::make_pipeline(); }",
     r"'cuda/pipeline': libcu\+\+'s cuda::barrier, .* or with __pipeline_memcpy_async"),
])
def test_a_cuda_feature_the_emulator_lacks_is_named(code, said):
    # before: only g++'s "'tex1Dfetch' was not declared in this scope", which reads like a missing #include
    # (cudaTextureObject_t itself NVRTC declares, and so does the emulator)
    with pytest.raises(sim.SimCompileError, match=said):
        llmcupy.RawModule(code=code, target="sim")


@pytest.mark.parametrize("declaration", ["__shared__ int s = 5;", "__shared__ float s[2] = {1.0f, 2.0f};",
                                         "static __shared__ int s = 5;"])
def test_a_shared_variable_with_an_initializer_is_refused_as_nvrtc_refuses_it(declaration):
    # before: it compiled, initialised once per emulator thread (block 1 saw what block 0 left), while
    # NVRTC refuses it ("initializer not allowed for __shared__ variable")
    code = f"__global__ void k(int* out) {{\n    {declaration}\n    out[threadIdx.x] = 0;\n}}\n"
    with pytest.raises(sim.SimCompileError, match=r"shared.cu:2:.*a __shared__ variable cannot have an initializer"):
        llmcupy.RawModule(code=code, target="sim", filename="shared.cu")
    # a comparison inside the array bound is no initializer
    module("#define N 4\n__global__ void k(int* out) { __shared__ int s[N == 4 ? 32 : 64]; s[0] = 1; }\n")


def test_an_initializer_after_a_shared_macro_or_in_a_string_is_no_shared_initializer(no_hazards):
    # the refusal of `__shared__ int s = 5;` took the text after a `#define SHARED __shared__` line, up
    # to the next `;` (a constant's initializer on the following line), and a string literal holding
    # "__shared__ ... = ...;" for declarations, and refused kernels NVRTC compiles
    k = module(r"""
    #define SHARED __shared__
    static const int BLOCK = 32;
    __device__ const char note[] = "__shared__ int s = 5;";
    __global__ void reverse(float* out, char* text) {
        SHARED float s[BLOCK];
        s[threadIdx.x] = threadIdx.x;
        __syncthreads();
        out[threadIdx.x] = s[BLOCK - 1 - threadIdx.x];
        text[threadIdx.x] = note[threadIdx.x];
    }
    """).get_function("reverse")
    out, text = np.zeros(32, np.float32), np.zeros(32, np.uint8)
    k((1,), (32,), (out, text))
    assert out.tolist() == list(range(31, -1, -1))
    assert bytes(text[:21]) == b"__shared__ int s = 5;"


# warpSize where C++ needs a constant: NVRTC refuses each ("expression must have a constant value")
WARP_SIZE_AS_A_CONSTANT = [
    "__shared__ float s[32][warpSize + 1];\n    s[0][threadIdx.x] = 1.0f;",
    "out[0] = Fixed<warpSize / 2>::value;",
    "static_assert(warpSize == 32, \"one warp\");",
]
WARP_SIZE_PREAMBLE = "template <int N> struct Fixed { static constexpr int value = N; };\n"


@pytest.mark.parametrize("use", WARP_SIZE_AS_A_CONSTANT)
def test_warp_size_where_a_constant_is_needed_is_refused_as_nvrtc_refuses_it(use):
    # before: warpSize was a constexpr in the emulator, so `__shared__ float s[warpSize]` compiled and ran
    # here and failed on the GPU
    code = f"{WARP_SIZE_PREAMBLE}__global__ void k(float* out) {{\n    {use}\n}}\n"
    with pytest.raises(sim.SimCompileError, match=r"(?s)warp.cu:3:.*warpSize is no compile-time constant in CUDA: "
                                                  r"NVRTC refuses it too.*write 32 there"):
        llmcupy.RawModule(code=code, target="sim", filename="warp.cu")


WARP_SIZE_AT_RUN_TIME = r"""
namespace tuning { constexpr int warpSize = 32; }   // a constant of one's own may take the name
__global__ void lanes(int* out) {
    __shared__ int per_warp[tuning::warpSize];
    extern __shared__ int scratch[];
    const int lane = threadIdx.x % warpSize, warp = threadIdx.x / warpSize;
    if (lane == 0) per_warp[warp] = warp;
    scratch[threadIdx.x] = lane;
    __syncthreads();
    out[threadIdx.x] = per_warp[warp] * 1000 + scratch[threadIdx.x] + (sizeof(warpSize) == 4 ? warpSize * 100 : 0);
}
"""


def test_warp_size_reads_32_wherever_cuda_allows_it(no_hazards):
    out = np.zeros(64, np.int32)
    with sim.metrics.collect() as launches:   # the instrumented build
        module(WARP_SIZE_AT_RUN_TIME).get_function("lanes")((1,), (64,), (out,), shared_mem=64 * 4)
    assert out.tolist() == [(t // 32) * 1000 + t % 32 + 3200 for t in range(64)]
    # a special register on a GPU: reading the emulator's stand-in variable is no global memory access
    assert launches[0]["totals"]["untracked_global"] == 0


def test_the_emulators_warp_size_verdicts_agree_with_nvrtc(have_nvrtc):
    from llmcupy import nvrtc

    for use in WARP_SIZE_AS_A_CONSTANT:
        code = f"{WARP_SIZE_PREAMBLE}__global__ void k(float* out) {{\n    {use}\n}}\n"
        result = nvrtc.compile_source(code, 80)
        assert not result.ok and "expression must have a constant value" in result.log, (use, result.log)
    result = nvrtc.compile_source(textwrap.dedent(WARP_SIZE_AT_RUN_TIME), 80)
    assert result.ok, result.log


# a local array sized at run time: g++ and clang build it (an extension), NVRTC refuses it
LOCAL_ARRAY_AT_RUN_TIME = [
    "float buf[n];\n    buf[0] = 1.0f;\n    out[0] = buf[0];",
    "float buf[warpSize];\n    buf[0] = 1.0f;\n    out[0] = buf[0];",
]


@pytest.mark.parametrize("use", LOCAL_ARRAY_AT_RUN_TIME)
def test_a_local_array_sized_at_run_time_is_refused_as_nvrtc_refuses_it(use):
    # before: -w silenced the compiler's every warning, -Wvla too, so the array ran here and the
    # kernel failed to build on the GPU
    code = f"__global__ void k(float* out, int n) {{\n    {use}\n}}\n"
    with pytest.raises(sim.SimCompileError, match=r"(?s)vla.cu:2:.*a local array sized at run time is not CUDA: "
                                                  r"NVRTC refuses it.*size it with a constant"):
        llmcupy.RawModule(code=code, target="sim", filename="vla.cu")


def test_the_emulators_local_array_verdicts_agree_with_nvrtc(have_nvrtc):
    from llmcupy import nvrtc

    for use in LOCAL_ARRAY_AT_RUN_TIME:
        result = nvrtc.compile_source(f"__global__ void k(float* out, int n) {{\n    {use}\n}}\n", 80)
        assert not result.ok and "expression must have a constant value" in result.log, (use, result.log)
    # sized by constants: fine on both
    fine = "template <int N> __global__ void k(float* out) { constexpr int M = 4; float a[N], b[M * 2]; " \
           "a[0] = 1.0f; b[0] = a[0]; out[0] = b[0]; }\ntemplate __global__ void k<8>(float*);\n"
    assert nvrtc.compile_source(fine, 80).ok
    out = np.zeros(1, np.float32)
    llmcupy.RawModule(code=fine, target="sim", name_expressions=["k<8>"]).get_function("k<8>")((1,), (1,), (out,))
    assert out[0] == 1.0


# A Welford warp reduction shuffling its (mean, m2, count) struct: CUDA's shuffle intrinsics take
# arithmetic and 16-bit float values only, a cooperative_groups tile any trivially copyable type
WELFORD_SHUFFLE = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
struct Welford { float mean, m2, count; };
__global__ void merge(float* out) {
    Welford w = {float(threadIdx.x), 0.0f, 1.0f};
#ifdef RAW
    Welford other = __shfl_down_sync(0xffffffffu, w, 16);
#else
    Welford other = cg::tiled_partition<32>(cg::this_thread_block()).shfl_down(w, 16);
#endif
    out[threadIdx.x] = other.mean;
}
"""


def test_a_struct_goes_through_a_tiles_shfl_but_not_through_shfl_sync(no_hazards):
    # before: __shfl_down_sync(mask, a_struct, 16) (and a float2, a float4, a pointer) ran in the emulator;
    # NVRTC refuses it ("no instance of overloaded function "__shfl_down_sync" matches the argument list")
    out = np.zeros(32, np.float32)
    module(WELFORD_SHUFFLE).get_function("merge")((1,), (32,), (out,))
    assert out.tolist() == [t + 16 if t < 16 else t for t in range(32)]
    with pytest.raises(sim.SimCompileError, match=r"(?s)welford.cu:8:.*a warp shuffle \(__shfl_sync, .*\) takes an "
                                                  r"int, unsigned, .* as CUDA declares it"):
        module(WELFORD_SHUFFLE, options=("-DRAW",), filename="welford.cu")


def test_the_emulators_shuffle_verdicts_agree_with_nvrtc(have_nvrtc):
    from llmcupy import nvrtc

    assert nvrtc.compile_source(textwrap.dedent(WELFORD_SHUFFLE), 80).ok
    result = nvrtc.compile_source(textwrap.dedent(WELFORD_SHUFFLE), 80, options=nvrtc.compile_options(80) + ["-DRAW"])
    assert not result.ok and "no instance of overloaded function" in result.log, result.log


# Simon Boehm's SGEMM kernels, written for nvcc, index with `uint` (glibc's <sys/types.h>, which NVRTC lacks)
BOEHM_UINT = r"""
__global__ void scale(float* out) {
    const uint row = blockIdx.x, col = threadIdx.x;
    out[row * blockDim.x + col] = (ushort)col;
}
"""


def test_host_typedefs_nvrtc_lacks_are_refused_unless_the_source_declares_them(no_hazards):
    # before: they compiled here (the emulator's header includes glibc's <sys/types.h>) and the kernel
    # failed to build on the GPU ('identifier "uint" is undefined')
    with pytest.raises(sim.SimCompileError, match=r"(?s)boehm.cu:3:.*in expansion of macro .uint.*\n\('uint' is a host "
                                                  r"typedef \(glibc's <sys/types.h>\) that NVRTC does not define: write "
                                                  r"unsigned int, .*; 'ushort' is a host typedef"):
        module(BOEHM_UINT, filename="boehm.cu")
    out = np.zeros((2, 4), np.float32)
    module("typedef unsigned int uint;\nusing ushort = unsigned short;\n" + BOEHM_UINT).get_function("scale")(
        (2,), (4,), (out,))
    assert out.tolist() == [[0, 1, 2, 3]] * 2
    # or the options: before, -Duint=... also rewrote glibc's own typedef ("duplicate 'unsigned'")
    module(BOEHM_UINT, options=("-Dushort=unsigned short", "-Duint=unsigned int")).get_function("scale")(
        (2,), (4,), (out,))


def test_the_emulators_host_typedef_verdicts_agree_with_nvrtc(have_nvrtc):
    from llmcupy import nvrtc

    result = nvrtc.compile_source(BOEHM_UINT, 80)
    assert not result.ok and 'identifier "uint" is undefined' in result.log, result.log
    assert nvrtc.compile_source("typedef unsigned int uint;\nusing ushort = unsigned short;\n" + BOEHM_UINT, 80).ok
    defines = ["-Dushort=unsigned short", "-Duint=unsigned int"]
    assert nvrtc.compile_source(BOEHM_UINT, 80, options=nvrtc.compile_options(80) + defines).ok


def test_builtin_align_is_defined_as_in_cudas_headers(no_hazards):
    # before: `struct __builtin_align__(8) W` (CUDA's host_defines.h spelling) did not compile
    k = module(r"""
    struct __builtin_align__(8) Pair { float a, b; };
    struct __align__(16) Quad { float a, b, c, d; };
    __global__ void sizes(int* out) { out[0] = alignof(Pair); out[1] = alignof(Quad); }
    """).get_function("sizes")
    out = np.zeros(2, np.int32)
    k((1,), (1,), (out,))
    assert out.tolist() == [8, 16]


def test_a_name_expression_that_names_no_kernel_says_so():
    # before: only g++'s errors in the emulator's generated entry points ("llmcupy_sim_entries:4:163:
    # error: expected primary-expression before 'int'"), nothing about the name given
    with pytest.raises(sim.SimCompileError, match=r"the source compiles, but a kernel name or name expression "
                                                  r"\(k, k<int>\) does not name a __global__ function as written"):
        llmcupy.RawModule(code="__global__ void k(float* x) { x[0] = 1.0f; }", target="sim",
                          name_expressions=["k<int>"])
    with pytest.raises(sim.SimCompileError) as info:   # an error in the source itself: no such hint
        llmcupy.RawModule(code="__global__ void k(float* x) { x[0] = nowhere; }", target="sim")
    assert "the source compiles" not in str(info.value)


def test_a_missing_closing_brace_is_named_as_such():
    # before: g++ blamed the emulator's entry points appended after the source, and the hint said
    # "the source compiles, but a kernel name ... does not name a __global__ function"
    with pytest.raises(sim.SimCompileError) as info:
        module("__global__ void k(float* y) {\n    if (y) {\n        y[0] = 1.0f;\n}\n")
    message = str(info.value)
    assert "the source compiles" not in message
    assert message.endswith("(kernel.cu ends inside a block: a '}' is missing (the outermost '{' left open is on "
                            "line 1); the errors in llmcupy_sim_entries, the emulator's code appended after the "
                            "source, follow from it)")
    module('__global__ void k(char* y) { y[0] = \'{\'; const char* s = "{{"; /* { */ }')   # braces balance


def test_options_given_as_one_string_are_refused():
    # tuple("-DFOO=3") split it into characters: the define was lost ("'FOO' was not declared")
    for make in (lambda: llmcupy.RawModule(code="__global__ void k(float* y) { y[0] = FOO; }", options="-DFOO=3"),
                 lambda: llmcupy.RawKernel("__global__ void k(float* y) { y[0] = FOO; }", "k", options="-DFOO=3")):
        with pytest.raises(TypeError, match=r"options must be a tuple of strings, one per option, e.g. "
                                            r"\('-DFOO=3',\); got the string '-DFOO=3'"):
            make()


def test_a_compiler_backend_other_than_nvrtc_is_refused_on_every_backend():
    # CuPy's backend="nvcc" was taken and ignored in the emulator, while on a GPU CuPy refused every
    # such module ("only nvrtc supports retrieving the mangled names for the given name expressions",
    # expressions the user never gave: llmcupy names every kernel through them). Now both refuse it alike.
    code = "__global__ void k(float* y) { y[0] = 1.0f; }"
    for target in ("sim", "cuda"):
        for make in (lambda: llmcupy.RawModule(code=code, backend="nvcc", target=target),
                     lambda: llmcupy.RawKernel(code, "k", backend="nvcc", target=target)):
            with pytest.raises(ValueError, match=r"^backend='nvcc': llmcupy compiles with NVRTC on a GPU \(it "
                                                 r"finds every kernel through NVRTC's name expressions\) and with "
                                                 r"g\+\+ in the emulator; leave backend= out$"):
                make()


SCALE_CODE = "__global__ void k(float* y) { y[threadIdx.x] = SCALE * threadIdx.x; }"

# Options as a learner writes them: NVRTC accepts the first list and refuses the second (checked
# against NVRTC itself below, where it is installed).
NVRTC_ACCEPTS = [("-DSCALE=2",), ("-D", "SCALE=2"), ("--define-macro=SCALE=2",), ("--define-macro", "SCALE=2"),
                 ("-DSCALE=2", "--use_fast_math", "-use_fast_math", "-lineinfo", "-G", "--ftz=true",
                  "-maxrregcount=32", "--fmad", "false", "-Xptxas", "-v", "-dopt=on", "-restrict", "-w"),
                 ("-DSCALE=2", "-arch", "sm_80"), ("-DSCALE=2", "-arch=sm_90a"), ("-DSCALE=2", "-std=c++11"),
                 ("-DSCALE=2", "-std=c++14"),
                 ("-DSCALE=7", "-USCALE", "-DSCALE=2")]
NVRTC_REFUSES = [("-DSCALE=2", "--bogus-option"), ("-DSCALE=2", "-O3"), ("-DSCALE=2", "-g"),
                 ("-DSCALE=2", "-use-fast-math"), ("-DSCALE=2", "-std=gnu++17"), ("SCALE=2",), ("-DSCALE=2", "-D"),
                 ("-DSCALE=2", "-arch=sm80"), ("-DSCALE=2", "--gpu-architecture=native")]


def test_nvrtc_options_take_effect_or_are_refused_as_nvrtc_refuses_them():
    # before: an option the emulator did not know was dropped without a word (a misspelt
    # '-use-fast-math' ran here and failed on the GPU), '-D', 'N=4' lost the define and made g++ say
    # "macro names must be identifiers", and -std=c++11/14 failed with pages of errors in the
    # emulator's own header
    for opts in NVRTC_ACCEPTS:
        y = np.zeros(4, np.float32)
        llmcupy.RawModule(code=SCALE_CODE, options=opts, target="sim").get_function("k")((1,), (4,), (y,))
        assert y.tolist() == [0, 2, 4, 6], opts
    for opts in NVRTC_REFUSES:
        with pytest.raises(sim.SimCompileError, match=r"^kernel.cu: (unrecognized NVRTC option|invalid value for "
                                                      r"NVRTC option|NVRTC option '-D' needs a value)") as info:
            llmcupy.RawModule(code=SCALE_CODE, options=opts, target="sim")
        assert "\n" not in str(info.value)
    with pytest.raises(sim.SimCompileError, match=r"'-use-fast-math' .*did you mean '--use_fast_math'\?"):
        llmcupy.RawModule(code=SCALE_CODE, options=("-use-fast-math",), target="sim")


def test_the_emulators_option_verdicts_agree_with_nvrtc(have_nvrtc):
    from llmcupy import nvrtc

    for opts, ok in [(o, True) for o in NVRTC_ACCEPTS] + [(o, False) for o in NVRTC_REFUSES]:
        result = nvrtc.compile_source(SCALE_CODE, 80, name_expressions=[], options=list(opts))
        assert result.ok == ok, (opts, result.log)


def test_an_edited_header_gives_a_new_build_in_the_same_process_and_the_next(tmp_path, monkeypatch):
    # before: the process kept the first build of a source (a notebook that edited its header and
    # built the module again got the old code), the compile cache did not hash headers included with
    # <...>, so another process got the old build too, and a relative -I folder was not found (g++
    # runs in a temporary folder)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inc").mkdir()
    header = tmp_path / "inc" / "gain.h"
    script = textwrap.dedent("""
        import sys, numpy as np, llmcupy
        m = llmcupy.RawModule(code=sys.argv[1], options=("-Iinc",), target="sim")
        y = np.zeros(2, np.float32)
        m.get_function("k")((1,), (2,), (y,))
        print(y[0])
    """)
    for include in ('"gain.h"', "<gain.h>"):
        code = f"#include {include}\n__global__ void k(float* y) {{ y[threadIdx.x] = GAIN; }}\n"
        for gain in (1, 2):
            header.write_text(f"#define GAIN {gain}.0f\n")
            y = np.zeros(2, np.float32)
            module(code, options=("-I", "inc")).get_function("k")((1,), (2,), (y,))
            assert y.tolist() == [gain, gain], include
            child = subprocess.run([sys.executable, "-c", script, code], capture_output=True, text=True, timeout=300)
            assert child.stdout.split()[-1:] == [f"{gain}.0"], (include, child.stderr[-1000:])
    header.write_text("#define GAIN 3.0f\n")   # a header given with -include
    y = np.zeros(2, np.float32)
    module("__global__ void k(float* y) { y[threadIdx.x] = GAIN; }", options=("-include", "inc/gain.h")
           ).get_function("k")((1,), (2,), (y,))
    assert y.tolist() == [3, 3]


def test_a_header_included_by_its_absolute_path_gives_a_new_build_when_edited(tmp_path):
    # before: `#include "/home/me/gain.h"` (a notebook writing its header's path into the source) was taken
    # for one of the emulator's own headers and not hashed, so an edited header gave the old build
    header = tmp_path / "gain.h"
    code = f'#include "{header}"\n__global__ void k(float* y) {{ y[threadIdx.x] = GAIN; }}\n'
    for gain in (1, 2):
        header.write_text(f"#define GAIN {gain}.0f\n")
        y = np.zeros(2, np.float32)
        module(code).get_function("k")((1,), (2,), (y,))
        assert y.tolist() == [gain, gain]


def test_an_unusable_default_cache_folder_says_which_variable_moves_it(tmp_path):
    # before: a bare OSError (NotADirectoryError, PermissionError) from deep in the compiler, and a
    # traceback from the CLIs; now one line naming LLMCUPY_CACHE_DIR (exit 2 from the CLIs)
    (tmp_path / "home").write_text("a file where the home folder should be")
    env = {k: v for k, v in os.environ.items() if k != "LLMCUPY_CACHE_DIR"}
    env.update(HOME=str(tmp_path / "home"), LLMCUPY_BACKEND="sim")
    proc = subprocess.run([sys.executable, "-m", "llmcupy.kernel", "gelu_forward", "1"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.startswith(f"error: cannot use {tmp_path}/home/.cache/llmcupy/sim for the emulator's compiled "
                                  "kernels (Not a directory); set LLMCUPY_CACHE_DIR to a folder"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_full_compile_cache_disk_is_a_setup_error_naming_the_folder(tmp_path, monkeypatch):
    # before: "the emulator could not compile kernel.cu" with the assembler's "No space left on
    # device" (the kernel seemed at fault) and a traceback from the CLIs; writing the unit itself
    # raised a bare OSError. Now a CacheFullError (a CompilerNotFound: set-up, exit 2 from the CLIs).
    # A full disk is simulated: g++ failing as it does then, and a write failing with ENOSPC.
    import errno
    import subprocess as real_subprocess
    from pathlib import Path

    from llmcupy.sim import compiler

    monkeypatch.setenv("LLMCUPY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiler, "_BUILT", {})
    code = "__global__ void k(float* y) { y[0] = 3.0f; }"
    full = real_subprocess.CompletedProcess([], 1, "", "/tmp/cc.s: Assembler messages:\n/tmp/cc.s: Fatal error: "
                                            "can't write 8 bytes to section .text: 'No space left on device'")
    compiler.compiler_identity("g++")  # the real compiler's identity (cached) before g++ is faked
    monkeypatch.setattr(compiler.subprocess, "run", lambda *a, **k: full)
    message = (f"no space left in the emulator's compile cache {tmp_path}/sim to build full.cu: free space there, "
               "remove old builds (llmcupy.sim.clear_cache()) or set LLMCUPY_CACHE_DIR to another folder")
    with pytest.raises(compiler.CompilerNotFound) as info:
        compiler.build_library(code, ["k"], filename="full.cu")
    assert isinstance(info.value, compiler.CacheFullError) and str(info.value) == message
    monkeypatch.setattr(compiler.subprocess, "run", real_subprocess.run)

    def no_space(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", no_space)
    with pytest.raises(compiler.CacheFullError, match=r"^no space left in the emulator's compile cache"):
        compiler.build_library(code + " ", ["k"], filename="full.cu")


def test_compile_cache_is_safe_across_processes(tmp_path):
    script = textwrap.dedent(f"""
        import os, numpy as np, llmcupy
        os.environ["LLMCUPY_CACHE_DIR"] = {str(tmp_path)!r}
        m = llmcupy.RawModule(code="__global__ void k(float* x) {{ x[threadIdx.x] = threadIdx.x; }}", target="sim")
        x = np.zeros(8, np.float32); m.get_function("k")((1,), (8,), (x,)); assert x[7] == 7
    """)
    env = dict(os.environ, LLMCUPY_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env) for _ in range(2)]
    assert all(p.wait() == 0 for p in procs)
    libs = list((tmp_path / "sim").glob("*.so"))
    assert len(libs) == 1
    assert not list((tmp_path / "sim").glob(".build-*"))


def _crash():
    # __builtin_trap (SIGILL) kills the process: the emulator turns only SIGSEGV/SIGBUS in kernel
    # code into an exception, so this stands for any crash a launch cannot survive. (The child
    # inherits pytest's faulthandler, which would print a Python traceback of this expected crash.)
    # Through a -D macro: written in the kernel's source, __builtin_trap is refused (NVRTC lacks it).
    faulthandler.disable()
    mod = module(r"""__global__ void trap(float* x) { if (threadIdx.x == 5) GCC_TRAP(); x[0] = 1.0f; }""",
                 options=("-DGCC_TRAP=__builtin_trap",))
    mod.get_function("trap")((1,), (32,), (np.zeros(1, np.float32),))
    return {"ok": True}


def test_a_crashing_kernel_fails_alone():
    result = run_isolated(_crash)
    assert result["ok"] is False and "signal 4 (SIGILL)" in result["error"] and result["signal"] == 4
    # the usual cause in a new version, and the command that finds it (the runner does not know the version)
    assert ("out-of-bounds write can do this: python -m llmcupy.kernel OP VERSION --sanitize runs it under "
            "memcheck, which names the access") in result["error"]


def test_a_dead_child_on_a_gpu_names_only_the_signal():
    # memcheck and --sanitize are the emulator's: a GPU's child gets no hint that cannot be followed there
    from llmcupy.harness import _runs_emulator, died_by_signal

    assert died_by_signal(11, emulator=False) == {
        "ok": False, "error": "the child process died with signal 11 (SIGSEGV) (see stderr)", "signal": 11}
    assert not _runs_emulator({"LLMCUPY_BACKEND": "cuda"}) and _runs_emulator({"LLMCUPY_BACKEND": "sim"})


def test_a_crashing_kernel_fails_alone_in_a_spawned_child():
    # the cuda backend's isolation (a device fault poisons the CUDA context; CUDA cannot be used
    # in a child forked after its initialisation) starts a fresh interpreter instead of forking
    result = run_isolated(_crash, start="spawn")
    assert result["ok"] is False and "signal 4" in result["error"]
    assert run_isolated(_launch_twice_in_child, GRID_CODE, start="spawn") == 128.0


# A wild pointer into the first page of the address space, which Linux never maps (vm.mmap_min_addr
# is at least a page): it faults every time. An index far past x (as before) could land in memory
# that a big test process has mapped, and corrupt it without a fault: a CI run of the whole suite
# died of a segfault in this test once.
WILD = r"""__global__ void wild(float* x) {
    if (threadIdx.x == 0) x[0] = 0.0f;
    *(float*)(size_t)(4 * (1 + threadIdx.x % 8)) = 1.0f;
}"""
DEEP = r"""
__device__ int rec(int n) { volatile char pad[4096]; pad[0] = char(n); return n == 0 ? 0 : rec(n - 1) + pad[0]; }
__global__ void deep(int* out, int n) { out[threadIdx.x] = rec(n); }
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_a_fault_in_kernel_code_is_an_exception_and_the_process_lives_on(workers):
    # as a GPU reports cudaErrorIllegalAddress: the block is abandoned and the launch raises; the
    # next launch in the same process runs (a notebook keeps its kernel)
    with sim.settings(workers=workers):
        with pytest.raises(sim.SimMemoryFaultError, match=r"kernel wild crashed with SIGSEGV in block \(\d+,0,0\), "
                                                           r"thread \(\d+,0,0\): an out-of-bounds memory access at 0x"
                                                           r"[0-9a-f]+ \(the launch again inside `with llmcupy.sim."
                                                           r"settings\(check=\"memory\"\):`, or with "
                                                           r"LLMCUPY_SIM_CHECK=memory, names the line\)"):
            module(WILD).get_function("wild")((4,), (32,), (np.zeros(1, np.float32),))
        with pytest.raises(sim.SimMemoryFaultError, match="kernel deep crashed with SIGSEGV .*: a fiber stack overflow "
                                                          r"\(LLMCUPY_SIM_STACK_KB"):
            module(DEEP).get_function("deep")((2,), (4,), (np.zeros(4, np.int32), np.int32(1 << 20)))
        total = np.zeros(1, np.float32)
        module(GRID_CODE).get_function("counter")((8,), (32,), (total, np.zeros(1, np.uint32)))
        assert total[0] == 128.0


OVERRUN = r"""__global__ void overrun(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 1.0f;   // n past y's end: a missing or wrong bound, as in a new version
}"""


@pytest.mark.parametrize("past", [False, True])
def test_a_plain_launch_writing_past_an_arrays_end_faults_and_leaves_the_next_array_alone(past):
    # two arrays back to back in one buffer, as two allocations may lie in the heap: an index past the
    # first one's end used to change the second (a wrong result of another op), or the allocator's
    # bookkeeping (glibc aborting the process later), silently; now it faults at once and names the
    # argument. (a write into the up to 15 bytes between an end and its fence: the next test)
    buffer = bytearray(512 * 4)   # not an array: the three views below are three allocations
    first, second = np.frombuffer(buffer, np.float32, 64), np.frombuffer(buffer, np.float32, 64, offset=256 * 4)
    after = np.frombuffer(buffer, np.float32, 192, offset=64 * 4)   # what follows `first`, up to `second`
    overrun = module(OVERRUN).get_function("overrun")
    if not past:
        overrun((2,), (64,), (first, np.int32(64)))
        assert first.tolist() == [1.0] * 64
    else:
        for _ in range(2):   # the second launch reuses the first one's fenced mapping: still fenced
            with pytest.raises(sim.SimMemoryFaultError, match=r"kernel overrun crashed with SIGSEGV in block "
                                                              r"\(\d+,0,0\), thread \(\d+,0,0\): an out-of-bounds "
                                                              r"memory access at 0x[0-9a-f]+, \d+ bytes past the end of "
                                                              r"argument 0 \(a 256-byte allocation\)"):
                overrun((8,), (64,), (first, np.int32(512)))
        assert first.tolist() == [1.0] * 64   # the writes before the fault, as on a GPU
    assert not after.any() and not second.any()


SHIFTED = r"""__global__ void shifted(float* y, int n, int shift) {
    int i = threadIdx.x;
    if (i < n) y[i + shift] = 1.0f;   // shift 1: y[n], as `i <= n` writes; shift -1: y[-1]
}"""


@pytest.mark.parametrize("shift, where", [(0, None), (1, "0 bytes past the end of"), (-1, "4 bytes before")])
def test_a_plain_launch_writing_just_outside_an_array_the_fences_do_not_reach_is_stopped(shift, where):
    # 3 floats (12 bytes): the copy keeps the address modulo 16, so y[3] lies in the 4 bytes before the
    # rear fence, and y[-1] in the page before the copy's start. Before, both writes were dropped without
    # a word (on a GPU they change the neighbouring allocation); now the canary bytes there give them away
    y = np.zeros(3, np.float32)
    shifted = module(SHIFTED).get_function("shifted")
    if where is None:
        shifted((1,), (32,), (y, np.int32(3), np.int32(shift)))
        assert y.tolist() == [1.0] * 3
        return
    with pytest.raises(sim.SimMemoryFaultError, match=r"^kernel shifted wrote out of bounds, " + where +
                       r" argument 0 \(a 12-byte allocation\): .* LLMCUPY_SIM_CHECK=memory, names the thread and line\)$"):
        shifted((1,), (32,), (y, np.int32(3), np.int32(shift)))
    assert y.tolist() == ([0.0, 1.0, 1.0] if shift == 1 else [1.0, 1.0, 0.0])   # the writes in bounds land
    shifted((1,), (32,), (y, np.int32(3), np.int32(0)))   # the slack is refilled: the next launch is clean


def test_a_plain_launch_on_two_allocations_back_to_back_reads_and_writes_each():
    # two allocations that touch (two views of one PyTorch tensor's storage come to the emulator as two
    # roots: gelu_forward(t[0], out=t[1])): the second one's address is the first one's end, and it was
    # taken for a pointer past the first one's fenced copy, so a correct kernel faulted ('0 bytes past
    # the end of argument 1') where a GPU runs it
    code = r"""__global__ void add_one(float* out, const float* inp, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) out[i] = inp[i] + 1.0f;
    }"""
    buffer = bytearray(128 * 4)
    inp, out = np.frombuffer(buffer, np.float32, 64), np.frombuffer(buffer, np.float32, 64, offset=64 * 4)
    inp[:] = np.arange(64)
    module(code).get_function("add_one")((1,), (64,), (out, inp, np.int32(64)))
    assert out.tolist() == (np.arange(64) + 1.0).tolist() and inp.tolist() == np.arange(64).tolist()


FILL = r"""__global__ void fill(float* y, float value, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = value;
}"""


def test_plain_launches_from_two_threads_on_one_allocation_both_land(monkeypatch):
    # each plain launch runs on a fenced copy of its allocations and copies them back whole: two launches
    # at once, from two threads, on two halves of one array, each wrote back the other's half as it had
    # copied it, and the later copy-back undid the earlier launch's writes. Here thread A's copy-back waits
    # (up to 2 s) for B to finish: B's writes were lost; now B waits for A's launch to end instead
    from llmcupy.sim import launcher

    data = np.zeros(128, np.float32)
    fill = module(FILL).get_function("fill")
    a_launched, b_done = threading.Event(), threading.Event()
    real_close = launcher._FencedArguments.close

    def close_after_b(self, copy_back=True):
        if threading.current_thread().name == "A":
            a_launched.set()
            b_done.wait(2.0)
        real_close(self, copy_back)

    monkeypatch.setattr(launcher._FencedArguments, "close", close_after_b)

    def b():
        a_launched.wait(5.0)
        fill((1,), (64,), (data[64:], np.float32(2.0), np.int32(64)))
        b_done.set()

    threads = [threading.Thread(target=lambda: fill((1,), (64,), (data[:64], np.float32(1.0), np.int32(64))), name="A"),
               threading.Thread(target=b, name="B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert data[:64].tolist() == [1.0] * 64 and data[64:].tolist() == [2.0] * 64


def test_a_stack_overflow_by_a_large_frame_is_caught_at_any_stack_size():
    # DEEP's recursion is merged by g++ into frames of about 12 KiB. Without stack probing the first
    # write of such a frame could land past the 4 KiB guard page: in unmapped memory (the handler
    # then took it for the emulator's own fault and killed the process: a whole-suite run died in the
    # test above) or in another fiber's stack. Where it lands depends on the stack size and on what
    # the process has mapped below the stack, so try many sizes, each in a child process.
    script = textwrap.dedent(f"""
        import numpy as np, llmcupy
        from llmcupy import sim
        try:
            llmcupy.RawModule(code={DEEP!r}).get_function("deep")((2,), (4,), (np.zeros(4, np.int32), np.int32(1 << 20)))
        except sim.SimMemoryFaultError as exc:
            print("CAUGHT", exc)
    """)
    failures = []
    sizes = list(range(64, 84)) + [200, 257]
    for batch in (sizes[i:i + 4] for i in range(0, len(sizes), 4)):
        children = {kb: subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True, env=dict(os.environ, LLMCUPY_BACKEND="sim",
                                                             LLMCUPY_SIM_STACK_KB=str(kb)))
                    for kb in batch}
        for kb, child in children.items():
            out, err = child.communicate(timeout=300)
            if child.returncode != 0 or "CAUGHT" not in out or "a fiber stack overflow" not in out:
                failures.append(f"LLMCUPY_SIM_STACK_KB={kb}: exit {child.returncode}: {out[-300:]} {err[-500:]}")
    assert not failures, "\n".join(failures)


def test_trap_fails_the_launch_with_the_place_and_the_process_lives_on():
    # __trap() aborts a launch on a GPU (cudaErrorLaunchFailure); here an exception naming the place
    k = module("__global__ void t(float* x, int bad) {\n"
               "    if (threadIdx.x == bad) __trap();\n"
               "    x[threadIdx.x] = 1.0f;\n}").get_function("t")
    x = np.zeros(32, np.float32)
    with pytest.raises(sim.SimLaunchError, match=r"kernel t called __trap\(\) at kernel.cu:2, block \(0,0,0\), "
                                                 r"thread \(7,0,0\)"):
        k((1,), (32,), (x, np.int32(7)))
    k((1,), (32,), (x, np.int32(-1)))
    assert x.sum() == 32


def test_brkpt_fails_the_launch_with_the_place_and_the_process_lives_on():
    # before: "'__brkpt' was not declared in this scope". A GPU with no debugger attached fails the launch at
    # a breakpoint; the emulator has no debugger
    k = module("__global__ void b(float* x, int bad) {\n"
               "    if (threadIdx.x == bad) __brkpt();\n"
               "    x[threadIdx.x] = 1.0f;\n}").get_function("b")
    x = np.zeros(32, np.float32)
    with pytest.raises(sim.SimLaunchError, match=r"kernel b reached __brkpt\(\) at kernel.cu:2, block \(0,0,0\), "
                                                 r"thread \(5,0,0\): a breakpoint stops the launch with an error on "
                                                 r"a GPU unless a debugger \(cuda-gdb\) is attached"):
        k((1,), (32,), (x, np.int32(5)))
    k((1,), (32,), (x, np.int32(-1)))
    assert x.sum() == 32


def test_kernel_qualifiers_nvrtc_takes_run_here():
    # before: none compiled here ("'__grid_constant__' does not name a type", "'__builtin_assume' was not
    # declared", "variable or field '__maxnreg__' declared void")
    mod = module("struct Scale { float by; int n; };\n"
                 'extern "C" __global__ void __maxnreg__(32) scaled(const __grid_constant__ Scale s, float* x) {\n'
                 "    int calls = 0;\n"
                 "    __builtin_assume(++calls > 0 && s.n > 0);   // a hint, never evaluated\n"
                 "    if (threadIdx.x < s.n) x[threadIdx.x] = s.by * threadIdx.x + calls;\n}\n"
                 'extern "C" __global__ void count(const __grid_constant__ int n, int* x) { x[threadIdx.x] = n; }\n')
    x, counts = np.zeros(8, np.float32), np.zeros(4, np.int32)
    mod.get_function("count")((1,), (4,), (np.int32(7), counts))
    assert counts.tolist() == [7] * 4
    with pytest.raises(llmcupy.KernelArgumentError, match=r"argument 0 \(int n\): expected a np.int32 scalar"):
        mod.get_function("count")((1,), (4,), (counts, counts))   # the parameter's type, not __grid_constant__'s
    scale = np.array([(2.0, 5)], dtype=np.dtype([("by", np.float32), ("n", np.int32)], align=True))[0]
    mod.get_function("scaled")((1,), (8,), (scale, x))
    assert x.tolist() == [0, 2, 4, 6, 8, 0, 0, 0]


DIVIDE = r"""#include <cuda/std/climits>
__global__ void share(int* y, int parts) {
    y[threadIdx.x] = 100 / parts;
}
__global__ void wrap(unsigned* y, unsigned n) {
    y[threadIdx.x] = threadIdx.x % n;
}
__global__ void negate(int* y, int d) {
    y[threadIdx.x] = INT_MIN / d;
}
"""


def test_an_integer_division_by_zero_is_an_exception_naming_the_line():
    # x86 traps (SIGFPE) on an integer division by zero, where a GPU gives some value and goes on: the
    # process died (exit -8) without a word. Now the launch stops naming kernel, line, type and thread,
    # and the process lives on. In a child, so that a regression fails this test, not the whole run.
    script = textwrap.dedent(f"""
        import numpy as np, llmcupy
        from llmcupy import sim
        m = llmcupy.RawModule(code={DIVIDE!r}, target="sim")
        for name, args in (("share", (np.zeros(4, np.int32), np.int32(0))),
                           ("wrap", (np.zeros(4, np.uint32), np.uint32(0))),
                           ("negate", (np.zeros(4, np.int32), np.int32(-1)))):
            try:
                m.get_function(name)((1,), (4,), args)
            except sim.SimLaunchError as exc:
                print(type(exc).__name__, str(exc).strip())
        y = np.zeros(4, np.int32)
        m.get_function("share")((1,), (4,), (y, np.int32(7)))
        print("ALIVE", y.tolist())
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, LLMCUPY_BACKEND="sim"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("SimLaunchError share: kernel share divides 'int' by zero (/ or %) at kernel.cu:3, "
                               "block (0,0,0), thread (0,0,0)"), lines
    assert lines[1].startswith("SimLaunchError wrap: kernel wrap divides 'unsigned int' by zero (/ or %) at "
                               "kernel.cu:6"), lines
    # INT_MIN / -1 is not checked at compile time; the SIGFPE it raises abandons the block
    assert lines[2].startswith("SimMemoryFaultError kernel negate crashed with SIGFPE in block (0,0,0)"), lines
    assert lines[3] == "ALIVE [14, 14, 14, 14]"


# kernel._run_one before a test replaced it: a forked child inherits the replacement (a spawned one
# imports kernel afresh, and this module with None here)
_real_run_one = None


def _run_one_with_a_planted_crash(op_name, number, sizes, args):
    from llmcupy import kernel

    if (op_name, number) == ("gelu_forward", 1):
        _crash()  # a deliberately faulting kernel in place of version 1
    return (_real_run_one or kernel._run_one)(op_name, number, sizes, args)


@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_kernel_all_reports_a_dead_child_as_that_versions_failure(monkeypatch, capsys, start):
    # the GPU path's bookkeeping (spawned children), and the emulator's (forked ones): the planted
    # crash fails version 1 alone, version 2 still runs and passes, the exit status is 1
    from llmcupy import kernel

    assert kernel.isolation(2, "cuda") == "spawn" and kernel.isolation(2, "sim") == "fork"
    assert kernel.isolation(1, "cuda") is None
    monkeypatch.setattr(sys.modules[__name__], "_real_run_one", kernel._run_one)
    monkeypatch.setattr(kernel, "_run_one", _run_one_with_a_planted_crash)
    monkeypatch.setattr(kernel, "isolation", lambda n, backend: start)
    rc = kernel.main(["gelu_forward", "--all", "--backend", "sim"])
    out = capsys.readouterr().out
    assert rc == 1
    # in the emulator: the command to type, with this version's op and number
    assert ("gelu_forward version 1: ERROR the emulator process died with signal 4 (SIGILL) (see stderr); a "
            "kernel's out-of-bounds write can do this: python -m llmcupy.kernel gelu_forward 1 --sanitize runs it "
            "under memcheck, which names the access") in out
    assert "1 passed, 1 failed, 0 skipped" in out


def _overrunning_gelu(a, bs):
    from llmcupy.ops._op import kernel_of

    n = a["inp"].size + 4096   # a bound past the arrays' ends, as a new version's mistake
    kernel_of("gelu_forward", "gelu_forward_kernel1")(((n + bs - 1) // bs,), (bs,), (a["out"], a["inp"], np.int32(n)))


def test_kernel_reports_a_version_reading_past_an_arrays_end_with_the_command_that_names_the_line(monkeypatch,
                                                                                                  capsys):
    # a plain run faults at the fence after the input (before: the read ran on into the heap, and the
    # single-version run then ended in a traceback); the FAIL line says which argument, and the
    # command that names the line
    from llmcupy import kernel

    monkeypatch.setattr(llmcupy.ops["gelu_forward"].versions[1], "launch", _overrunning_gelu)
    assert kernel.main(["gelu_forward", "1", "--backend", "sim", "--block-size", "128"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("gelu_forward version 1: ERROR SimMemoryFaultError: kernel gelu_forward_kernel1 crashed "
                             "with SIGSEGV in block ("), out
    # how far past depends on which block's fault is reported first: with two or more workers, the
    # blocks after the first one past the end fault too (512 bytes further per block of 128 floats)
    assert re.search(r", \d+ bytes past the end of argument 1 \(a 4096-byte allocation\)", out[0]), out[0]
    assert out[1:3] == ["  python -m llmcupy.kernel gelu_forward 1 --sanitize names the line", "FAIL"]


def _pid_of_child():
    return os.getpid()


def _raise_in_child():
    raise RuntimeError("planted failure")


def _wrong_outputs():
    return {"ok": False}


def _interrupted():
    raise KeyboardInterrupt   # as Ctrl-C reaching the child


@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_a_child_interrupted_stops_the_run_in_the_parent(start):
    # Ctrl-C reaches the child too: it is not one version's failure but the end of the run, and
    # the child is gone (nothing runs on unseen)
    from llmcupy.harness import runner

    with runner(start) as versions:
        with pytest.raises(KeyboardInterrupt):
            versions.call(_interrupted)
        if start == "spawn":
            assert versions._proc is None
        assert versions.call(_pid_of_child) != os.getpid()   # the runner still works afterwards


def test_spawned_runner_reuses_its_child_until_a_call_fails():
    # kernel --all on a GPU: one spawned child runs the versions (a spawn costs seconds of Python,
    # CuPy and a CUDA context); a crash or an exception costs a fresh child, for the next call only
    from llmcupy.harness import SpawnedRunner

    with SpawnedRunner() as runner:
        first = runner.call(_pid_of_child)
        assert runner.call(_pid_of_child) == first != os.getpid() and runner.starts == 1
        crashed = runner.call(_crash)
        assert crashed["ok"] is False and "signal 4" in crashed["error"]
        second = runner.call(_pid_of_child)
        assert second != first and runner.starts == 2
        raised = runner.call(_raise_in_child)
        assert raised == {"ok": False, "error": "RuntimeError: planted failure"}
        assert runner.call(_pid_of_child) not in (first, second) and runner.starts == 3
        assert runner.call(_wrong_outputs) == {"ok": False}  # a FAIL may come from a stray write
        assert runner.call(_launch_twice_in_child, GRID_CODE) == 128.0 and runner.starts == 4


def test_kernel_json_keeps_the_versions_finished_before_a_run_is_stopped(monkeypatch, tmp_path, capsys):
    from llmcupy import kernel

    run_one = kernel._run_one

    def interrupted_at_version_2(op_name, number, sizes, args):
        if number == 2:
            raise KeyboardInterrupt  # as a time limit stopping the run
        return run_one(op_name, number, sizes, args)

    monkeypatch.setattr(kernel, "isolation", lambda n, backend: None)
    monkeypatch.setattr(kernel, "_run_one", interrupted_at_version_2)
    path = tmp_path / "catalogue.json"
    assert kernel.main(["gelu_forward", "--all", "--backend", "sim", "--json", str(path)]) == 130
    assert capsys.readouterr().err.strip() == f"interrupted after 1 of 2 versions; {path} holds the versions that finished"
    records = json.loads(path.read_text())
    assert [(r["op"], r["version"], r["ok"]) for r in records] == [("gelu_forward", 1, True)]
    assert not (tmp_path / "catalogue.json.tmp").exists()


def test_asan_mode_reports_out_of_bounds_global_access(tmp_path):
    libasan = subprocess.run(["g++", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(libasan) or not os.path.exists(libasan):
        pytest.skip("g++ has no AddressSanitizer runtime here")
    script = textwrap.dedent("""
        import numpy as np, llmcupy
        m = llmcupy.RawModule(code="__global__ void k(float* x, int n) { x[threadIdx.x] = 1.0f; }", target="sim")
        x = np.zeros(1000, np.float32)[:30].copy()
        m.get_function("k")((1,), (32,), (x, np.int32(30)))
    """)
    env = dict(os.environ, LLMCUPY_SIM_ASAN="1", LD_PRELOAD=libasan, ASAN_OPTIONS="detect_leaks=0",
               LLMCUPY_CACHE_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "heap-buffer-overflow" in proc.stderr


def _launch_twice_in_child(mod_code):
    m = module(mod_code)
    out = np.zeros(1, np.float32)
    with sim.settings(workers=2):
        m.get_function("counter")((8,), (32,), (out, np.zeros(1, np.uint32)))
    return float(out[0])


def test_launch_in_a_forked_child_after_the_parent_launched():
    # the parent's worker threads do not exist in a child: the child must not wait for them
    total = np.zeros(1, np.float32)
    with sim.settings(workers=2):
        module(GRID_CODE).get_function("counter")((8,), (32,), (total, np.zeros(1, np.uint32)))
    assert run_isolated(_launch_twice_in_child, GRID_CODE) == 128.0


def test_raw_kernel_has_cupys_signature(no_hazards):
    code = 'extern "C" __global__ void axpy(float* y, const float* x, float a, int n) {\n' \
           '    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) y[i] += a * x[i];\n}\n'
    k = llmcupy.RawKernel(code, "axpy", target="sim")
    x = np.arange(100, dtype=np.float32)
    y = np.ones(100, np.float32)
    k((4,), (32,), (y, x, np.float32(2.0), np.int32(100)))
    assert (y == 1 + 2 * x).all()
    assert "axpy(float* y, const float* x, float a, int n)" in repr(k)
    # CuPy's parameter names and kinds (RawKernel(str code, str name, tuple options=(), str backend,
    # bool translate_cucomplex, *, ...)): code= was refused as an unexpected keyword, and
    # translate_cucomplex given by position as a sixth argument too many
    for by_keyword in (llmcupy.RawKernel(code=code, name="axpy", options=(), backend="nvrtc", target="sim"),
                       llmcupy.RawKernel(code, "axpy", (), "nvrtc", False, target="sim")):
        by_keyword((4,), (32,), (y, x, np.float32(-2.0), np.int32(100)))
    assert (y == 1 - 2 * x).all()



def test_kernels_and_variables_may_bear_the_names_of_the_emulators_entry_parameters(no_hazards):
    # the emulator's generated entry points took parameters named c, a, r and size: a kernel called
    # `c` did not compile ('does not name a __global__ function') and a __device__ variable called
    # `size` read back as that parameter (8 bytes of the stack); NVRTC takes any of these names
    code = ("__device__ float size[3];\n"
            "__global__ void a(float* y) { y[threadIdx.x] = 1.0f; }\n"
            "__global__ void c(float* y) { y[threadIdx.x] += size[threadIdx.x]; }\n"
            "__global__ void r(float* y) { y[threadIdx.x] *= 2.0f; }\n")
    mod = module(code)
    table = mod.global_array("size", np.float32)
    assert table.shape == (3,)
    table[:] = [1.0, 2.0, 3.0]
    y = np.zeros(3, np.float32)
    for name in ("a", "c", "r"):
        mod.get_function(name)((1,), (3,), (y,))
    assert y.tolist() == [4.0, 6.0, 8.0]


DISJOINT_CODE = r"""
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;
extern "C" __global__ void k(const int* in, int* out) {
  int t = threadIdx.x, v = in[t];
  auto tile = cg::tiled_partition<16>(cg::this_thread_block());
  out[32 + t] = cg::reduce(tile, v, cg::plus<int>());
  out[t] = __shfl_up_sync(0xffffffffu, v, 1);   // lane 16 must get lane 15's v
}
extern "C" __global__ void halves(const int* in, int* out) {
  int t = threadIdx.x, v = in[t];
  out[32 + t] = __shfl_xor_sync(t < 16 ? 0xffffu : 0xffff0000u, v, 1, 16);
  out[t] = __shfl_up_sync(0xffffffffu, v, 1);
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_disjoint_mask_collectives_do_not_disturb_a_wider_one(order, no_hazards):
    # the emulator-lab issue's repro: after two half-warp collectives a full-warp shuffle used to
    # read stale posts (lane 16 got its own value)
    v = np.arange(32, dtype=np.int32) * 3 + 1
    up = np.concatenate([v[:1], v[:-1]])
    for name in ("k", "halves"):
        out = np.zeros(64, np.int32)
        with sim.settings(order=order, seed=1):
            module(DISJOINT_CODE).get_function(name)((1,), (32,), (v, out))
        assert (out[:32] == up).all() and out[16] == v[15], name
    out = np.zeros(64, np.int32)
    module(DISJOINT_CODE).get_function("k")((1,), (32,), (v, out))
    assert (out[32:] == np.repeat(v.reshape(2, 16).sum(1), 16)).all()
    module(DISJOINT_CODE).get_function("halves")((1,), (32,), (v, out))
    assert (out[32:] == v[np.arange(32) ^ 1]).all()


def test_only_declared_volatile_data_takes_the_instrumented_build():
    from llmcupy.runtime.module import kernels_dir
    from llmcupy.sim.compiler import uses_volatile

    # the catalogue's one volatile cast (a CAS loop's first guess) keeps the fast build
    assert not uses_volatile((kernels_dir() / "layernorm_backward.cu").read_text())
    assert not uses_volatile('asm volatile("membar.gl;");  // volatile in a comment')
    assert uses_volatile("__device__ void r(volatile float* s) { s[0] += s[1]; }")
    assert uses_volatile("__shared__ volatile int flag;")


# --- fiber stacks within the process's mapping limit ---------------------------------------------

FIBER_KERNEL = r"""
#define LIBRARY_TAG %d
extern "C" __global__ void tag(int* out) {
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = LIBRARY_TAG;
}
"""


def _mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def _fibers_in_child(budget: int) -> dict:
    # a fresh process: the test suite's own libraries keep stacks too, which would blur the count
    from llmcupy.sim import launcher

    launcher.FIBER_BUDGET = budget
    launcher._fiber_holders.clear()
    modules = [llmcupy.RawModule(code=FIBER_KERNEL % i, target="sim") for i in range(6)]
    before = _mappings()
    results = []
    for i, mod in enumerate(modules):
        out = np.zeros(4 * 1024, np.int32)
        with sim.settings(workers=2):
            mod.get_function("tag")((4,), (1024,), (out,))
        results.append(bool((out == i).all()))
    grown = _mappings() - before
    # a library whose stacks were given back launches again, correctly
    out = np.zeros(4 * 1024, np.int32)
    modules[0].get_function("tag")((4,), (1024,), (out,))
    results.append(bool((out == 0).all()))
    return {"grown": grown, "results": results, "held": sum(launcher._fiber_holders.values()),
            "holders": len(launcher._fiber_holders)}


def test_fiber_stacks_stay_within_the_budget_as_libraries_come_and_go():
    # Six libraries each running 1024-thread blocks on two workers would keep 6 * 2 * 1024 stacks
    # (two mappings each: ~24,600 mappings, vm.max_map_count is 65,530) for the life of the process;
    # with a budget of 2,048 stacks the least recently launched give theirs back.
    r = run_isolated(_fibers_in_child, 2048)
    assert r["results"] == [True] * 7
    assert r["held"] <= 2048 and r["holders"] <= 2
    assert r["grown"] < 2 * 2048 + 200, r   # stacks and guard pages, plus the libraries' own mappings


def test_a_launch_uses_no_more_workers_than_the_budget_holds(monkeypatch):
    from llmcupy.sim import launcher

    class Library:   # stands in for a SimLibrary: only release_fibers is called
        released = 0

        def release_fibers(self):
            Library.released += 1

    monkeypatch.setattr(launcher, "FIBER_BUDGET", 3000)
    monkeypatch.setattr(launcher, "_fiber_holders", {})
    first, second = Library(), Library()
    assert launcher._reserve_fibers(first, 1024, 8) == 2          # 2 * 1024 of 3000
    assert launcher._reserve_fibers(second, 256, 4) == 4          # 1024 more: 3072 > 3000, first gives back
    assert Library.released == 1 and list(launcher._fiber_holders) == [second]
    assert launcher._reserve_fibers(first, 1024, 1) == 1 and Library.released == 1   # 1024 + 1024 fit
