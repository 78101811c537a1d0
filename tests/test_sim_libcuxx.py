"""The emulator against the real libcu++ (llmcupy/sim/libcuxx.py): CuPy's bundled CCCL, read as host code
behind a generated wrapper per public header, or the emulator's stand-ins where CuPy is not installed.

Before: any libcu++ header beyond the emulator's ~20 stand-ins failed here ('cuda/std/optional: No such
file or directory') while NVRTC compiles it under CuPy's options. test_nvrtc_parity.py's LIBCUXX_KERNELS
holds the kernels NVRTC compiles and the emulator runs; these are the emulator's own concerns.
"""
import re

import numpy as np
import pytest

import llmcupy
from llmcupy import sim
from llmcupy.sim import compiler as sim_compiler
from llmcupy.sim import libcuxx

needs_real = pytest.mark.skipif(libcuxx.libcudacxx_dir() is None,
                                reason=f"no real libcu++ here (CuPy's, or {libcuxx.ENV_VAR})")
KERNEL = 'extern "C" __global__ void k(float* p) { p[threadIdx.x] = 1.0f; }\n'


@needs_real
def test_terminate_fails_the_launch_not_the_process():
    # an empty optional's value(): libcu++'s host cuda::std::terminate() calls ::exit(-1), which would end
    # the Python process; on a GPU it is __trap(), a failed launch
    code = ("#include <cuda/std/optional>\n__global__ void k(float* p) {\n"
            "    cuda::std::optional<float> o;\n    if (p[0] > 0) o = 1.f;\n    p[1] = o.value();\n}\n")
    with pytest.raises(sim.SimLaunchError, match=r"__trap\(\)"):
        llmcupy.RawModule(code=code, target="sim").get_function("k")((1,), (1,), (np.zeros(2, np.float32),))


@needs_real
def test_assert_after_a_libcuxx_header_is_still_the_device_assert():
    # libcu++ includes the host's <assert.h>, which would redefine assert() as the host's (an abort)
    code = "#include <cuda/std/span>\n__global__ void k(float* p) {\n    assert(p[0] > 0);\n}\n"
    with pytest.raises(sim.SimDeviceAssertError, match=r"p\[0\] > 0"):
        llmcupy.RawModule(code=code, target="sim").get_function("k")((1,), (1,), (np.zeros(1, np.float32),))


@needs_real
@pytest.mark.parametrize("header, reason", [
    ("cuda/std/barrier", "not emulated: copy with cooperative_groups' cg::memcpy_async"),
    ("cuda/std/latch", "not emulated"), ("cuda/std/semaphore", "not emulated"), ("cuda/pipeline", "not emulated"),
    ("cuda/warp", "not emulated: use __shfl_sync"), ("cuda/ptx", "inline PTX is not emulated"),
    ("cuda/stream_ref", "host code, which a RawModule source does not hold"),
    ("cuda/mdspan", "use cuda::std::mdspan from <cuda/std/mdspan>")])
def test_the_headers_the_emulator_cannot_run_are_refused_by_name(header, reason):
    # NVRTC compiles these (but stream_ref); the emulator's waits would hang its fibers, ptx and warp are
    # device-only, mdspan's accessors ask the CUDA driver
    with pytest.raises(sim.SimCompileError, match=f"'{header}': .*{re.escape(reason)}"):
        llmcupy.RawModule(code=f"#include <{header}>\n{KERNEL}", target="sim")


@needs_real
def test_cuda_barrier_keeps_aligned_size_t():
    # cg::memcpy_async's size type, as the stand-in had it; cuda::barrier itself is refused by name
    code = "#include <cuda/barrier>\n__global__ void k(float* p) { cuda::aligned_size_t<16> n(32); p[0] = n; }\n"
    p = np.zeros(1, np.float32)
    llmcupy.RawModule(code=code, target="sim").get_function("k")((1,), (1,), (p,))
    assert p[0] == 32
    with pytest.raises(sim.SimCompileError, match="'cuda::barrier': libcu\\+\\+'s cuda::barrier, .* not emulated"):
        llmcupy.RawModule(code="#include <cuda/barrier>\n__global__ void k() { __shared__ cuda::barrier<"
                               "cuda::thread_scope_block>* b; }\n", target="sim")


@needs_real
def test_each_wrapper_opens_and_closes_the_real_header(tmp_path):
    # the renames of the kernel's source (std, uint32_t, ...) are off inside, and on again after
    root = libcuxx.libcudacxx_dir()
    folder = libcuxx.wrapper_dir(tmp_path, root)
    names = libcuxx.public_headers(root)
    assert {"cuda/std/optional", "cuda/std/span", "cuda/cmath", "nv/target"} <= set(names)
    for name in names:
        lines = [line for line in (folder / name).read_text().splitlines() if line.startswith("#")]
        if name in libcuxx.REFUSED:
            assert lines == ["#pragma once", f"#error \"'{name}': {libcuxx.REFUSED[name]}\""]
            continue
        begin = lines.index('#include "llmcupy_sim_libcuxx_begin.h"')
        assert lines[begin:begin + 3] == ['#include "llmcupy_sim_libcuxx_begin.h"',
                                          f'#include "{(root / libcuxx._INSTEAD.get(name, name)).as_posix()}"',
                                          '#include "llmcupy_sim_libcuxx_end.h"'], name
        # the host's macros libcu++ uses are back while the outermost wrapper reads, and gone after it
        assert lines[0] == "#pragma once" and lines[1] == "#ifndef LLMCUPY_SIM_LIBCUXX_READING", name
        assert '#pragma pop_macro("LDBL_MAX")' in lines[:begin] and "#undef LDBL_MAX" in lines[begin + 3:], name
        assert lines[-1] == '#include "llmcupy_sim_nvrtc_names_on.h"', name
    # made once, whole: a second call finds it
    assert libcuxx.wrapper_dir(tmp_path, root) == folder
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]


def test_a_setting_that_names_no_libcuxx_is_one_line_naming_what_to_set(monkeypatch, tmp_path):
    monkeypatch.setenv(libcuxx.ENV_VAR, str(tmp_path))
    with pytest.raises(sim_compiler.CompilerNotFound) as info:
        llmcupy.RawModule(code=f"#include <cuda/std/cmath>\n{KERNEL}", target="sim")
    assert str(info.value) == (
        f"{libcuxx.ENV_VAR}={tmp_path} holds no libcu++ (no cuda/std/__cccl/version.h there): set it to a libcudacxx "
        "include folder (CuPy's is cupy/_core/include/cupy/_cccl/libcudacxx), to 'none' for the emulator's "
        "stand-ins, or unset it")


@needs_real
def test_the_setting_names_a_libcuxx_folder(monkeypatch):
    monkeypatch.setenv(libcuxx.ENV_VAR, str(libcuxx.libcudacxx_dir()))
    p = np.arange(8, dtype=np.float32)
    code = "#include <cuda/std/span>\n__global__ void k(float* p) { cuda::std::span<float> s(p, 8); p[0] = s[7]; }\n"
    llmcupy.RawModule(code=code, target="sim").get_function("k")((1,), (1,), (p,))
    assert p[0] == 7


@needs_real
def test_only_a_build_that_reaches_libcuxx_depends_on_which(monkeypatch, tmp_path):
    # the catalogue's kernels include no cuda/ header: a CuPy upgrade (a new libcu++) keeps their cached builds
    header = tmp_path / "mine.cuh"
    header.write_text("#include <cuda/std/cstdint>\n")
    plain, through_header = KERNEL, f'#include "mine.cuh"\n{KERNEL}'
    cub = f"#include <cub/block/block_reduce.cuh>\n{KERNEL}"
    options = (f"-I{tmp_path}",)
    built = {}
    for setting in ("", "none"):
        monkeypatch.setenv(libcuxx.ENV_VAR, setting)
        built[setting] = [sim_compiler.build_library(code, ["k"], options) for code in (plain, through_header, cub)]
    assert built[""][0] == built["none"][0]
    assert built[""][1] != built["none"][1] and built[""][2] != built["none"][2]
    assert not sim_compiler.reaches_libcuxx(plain, options) and sim_compiler.reaches_libcuxx(through_header, options)


@needs_real
def test_the_preprocessor_scan_of_kernel_names_reads_the_real_libcuxx():
    # the GPU path's name expressions: kernels in disabled #if branches are left out, also after a header
    # only the real libcu++ has
    code = ("#include <cuda/std/optional>\n#if 0\n" + KERNEL.replace(" k(", " gone(") + "#endif\n" + KERNEL)
    assert sim_compiler.compiled_kernel_names(code) == ["k"]


@needs_real
def test_the_runtime_functions_libcuxx_calls_stay_out_of_the_kernels_reach():
    # libcu++'s host code calls cudaGetLastError, cudaGetSymbolAddress, ...: the emulator gives it its own, under
    # other names, so a kernel calling one is refused as under NVRTC ('identifier "cudaGetLastError" is undefined')
    code = "#include <cuda/std/span>\n__global__ void k(int* p) { p[0] = cudaGetLastError(); }\n"
    with pytest.raises(sim.SimCompileError, match="'cudaGetLastError': the CUDA runtime API is host code"):
        llmcupy.RawModule(code=code, target="sim")


@needs_real
def test_get_device_address_is_the_objects_own_address():
    # libcu++'s host code asks the CUDA runtime (cudaGetSymbolAddress); the emulator's device memory is the
    # process's, so the address is the object's own
    code = ("#include <cuda/memory>\n__device__ float g = 3.f;\n"
            "__global__ void k(float* p) { p[0] = *cuda::get_device_address(g); p[1] = cuda::get_device_address(g) == &g; }\n")
    p = np.zeros(2, np.float32)
    llmcupy.RawModule(code=code, target="sim").get_function("k")((1,), (1,), (p,))
    assert p.tolist() == [3, 1]


# Thread 0 waits for the block's last thread, which the emulator runs after it in the default order: before,
# libcu++'s host atomics (GCC's __atomic builtins) never yielded, so the waiter spun until the watchdog
# (120 s) and the setter never ran; now a poll through them yields as one through CUDA's atomics does.
SPIN_WAITS = {
    "load": "while (f.load(cuda::std::memory_order_acquire) == 0) {}",
    "wait": "f.wait(0, cuda::std::memory_order_acquire);",
    "fetch_or": "while (f.fetch_or(0) == 0) {}",
    "exchange": "while (f.exchange(0) == 0) {} f.store(1);",
    "compare_exchange": "int seen = 1; while (!f.compare_exchange_strong(seen, 1)) seen = 1;",
}


@needs_real
@pytest.mark.parametrize("order", ["forward", "random"])
@pytest.mark.parametrize("wait", list(SPIN_WAITS))
def test_a_spin_on_a_libcuxx_atomic_lets_the_other_threads_run(wait, order):
    code = ("#include <cuda/atomic>\n"
            'extern "C" __global__ void k(int* flag, int* out) {\n'
            "    cuda::atomic_ref<int, cuda::thread_scope_block> f(flag[blockIdx.x]);\n"
            "    if (threadIdx.x == blockDim.x - 1) { out[2 * blockIdx.x + 1] = 42; f.store(1); f.notify_all(); }\n"
            f"    else if (threadIdx.x == 0) {{ {SPIN_WAITS[wait]} out[2 * blockIdx.x] = 1; }}\n"
            "}\n")
    flag, out = np.zeros(2, np.int32), np.zeros(4, np.int32)
    with sim.settings(order=order, seed=5, timeout=20):
        llmcupy.RawModule(code=code, target="sim").get_function("k")((2,), (64,), (flag, out))
    assert out.tolist() == [1, 42, 1, 42] and flag.tolist() == [1, 1]


@needs_real
def test_a_spin_lock_on_a_libcuxx_atomic_serialises_its_critical_section():
    code = ("#include <cuda/atomic>\n"
            'extern "C" __global__ void k(int* lock, int* count) {\n'
            "    cuda::atomic_ref<int, cuda::thread_scope_device> l(*lock);\n"
            "    int expected = 0;\n"
            "    while (!l.compare_exchange_weak(expected, 1, cuda::std::memory_order_acquire)) expected = 0;\n"
            "    int c = *count;\n"
            "    __nanosleep(100);   // the holder yields inside: the others must find the lock taken\n"
            "    *count = c + 1;\n"
            "    l.store(0, cuda::std::memory_order_release);\n"
            "}\n")
    lock, count = np.zeros(1, np.int32), np.zeros(1, np.int32)
    with sim.settings(order="random", seed=5, timeout=20):
        llmcupy.RawModule(code=code, target="sim").get_function("k")((2,), (32,), (lock, count))
    assert count.tolist() == [64] and lock.tolist() == [0]


NV_TARGET_QUERIES = r"""
__global__ void k(int* p) {
    NV_IF_TARGET(NV_IS_DEVICE, (p[0] = 1;), (p[0] = 2;))
    NV_IF_TARGET(NV_PROVIDES_SM_90, (p[1] = 1;), (p[1] = 2;))
    NV_DISPATCH_TARGET(NV_IS_EXACTLY_SM_90, (p[2] = 90;), NV_IS_EXACTLY_SM_80, (p[2] = 80;))
    p[3] = __CUDA_MINIMUM_ARCH__;
    p[4] = NV_TARGET_MINIMUM_SM_INTEGER;
    p[5] = f();
}
"""


@needs_real
@pytest.mark.parametrize("arch, expected", [(None, [1, 2, 80, 800, 80, 1]), ("sm_90", [1, 1, 90, 900, 90, 1])])
def test_a_kernels_nv_if_target_takes_nvrtcs_branch_for_the_emulated_arch(arch, expected):
    # before: nv/target, read as host code (libcu++'s own branches must be the host ones here), gave the
    # kernel's NV_IF_TARGET the host branch too: NV_IS_DEVICE false, NV_PROVIDES_SM_* false, whatever -arch said.
    # A libcu++ header read after the kernel's first use still compiles (its branches are host ones again).
    code = ("#include <cuda/std/span>\n"   # reads nv/target inside another header
            "__device__ int f() { NV_IF_TARGET(NV_IS_HOST, (return 2;), (return 1;)) }\n"
            "#include <cuda/std/optional>\n#include <cuda/atomic>\n" + NV_TARGET_QUERIES)
    options = () if arch is None else (f"-arch={arch}",)
    p = np.zeros(6, np.int32)
    llmcupy.RawModule(code=code, target="sim", options=options).get_function("k")((1,), (1,), (p,))
    assert p.tolist() == expected
