"""The emulator off Linux x86-64 with g++: clang (Apple's `g++` is clang), aarch64, macOS, Windows.

The clang tests run with every clang on PATH, the aarch64 one when a cross compiler and qemu-user are
(Debian: g++-aarch64-linux-gnu, qemu-user); each skips with the reason otherwise. The platform checks
run everywhere, on a pretended sys.platform.
"""

import os
import re
import shutil
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import llmcupy
from llmcupy import sim
from llmcupy.sim import compiler
from llmcupy.sim import platform as sim_platform


def _clangs() -> list:
    """clang++ and every versioned clang++-N on PATH (Debian installs several side by side)."""
    names = ["clang++"]
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        try:
            names += sorted(name for name in os.listdir(folder) if re.fullmatch(r"clang\+\+-\d+", name))
        except OSError:
            pass
    found = {}   # one name per compiler: clang++ is usually a link to one of the versioned ones
    for name in names:
        path = shutil.which(name)
        if path is not None:
            found.setdefault(os.path.realpath(path), name)
    return sorted(found.values()) or [None]


@pytest.fixture(params=_clangs())
def clang(request, monkeypatch, tmp_path):
    """Builds with each clang on PATH (into a cache of its own) for the test."""
    if request.param is None:
        pytest.skip("clang++ is not on PATH (Debian: apt-get install clang)")
    monkeypatch.setenv("CXX", request.param)
    monkeypatch.setenv("LLMCUPY_CACHE_DIR", str(tmp_path))
    return request.param


def module(code, **kw):
    return llmcupy.RawModule(code=textwrap.dedent(code), target="sim", **kw)


REDUCE = r"""
#include <cuda_fp16.h>
// a block's sum through warp shuffles and shared memory, and a float rounded through __half
extern "C" __global__ void block_sum(const float* in, float* out, __half* halves) {
    __shared__ float partial[32];
    float v = in[blockIdx.x * blockDim.x + threadIdx.x];
    for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) { out[blockIdx.x] = v; halves[blockIdx.x] = __float2half(v / 3.0f); }
    }
}
"""

# NVIDIA's warp-aggregated atomics: warp_res is set in the leader lane only, then shuffled from it
AGGREGATED = r"""
__device__ int atomicAggInc(int* ctr) {
    unsigned active = __activemask();
    int leader = __ffs(active) - 1;
    unsigned rank = __popc(active & ((1u << (threadIdx.x % 32)) - 1));
    int warp_res;
    if (threadIdx.x % 32 == leader) warp_res = atomicAdd(ctr, __popc(active));
    warp_res = __shfl_sync(active, warp_res, leader);
    return warp_res + rank;
}
extern "C" __global__ void filter(const int* in, int* out, int* count, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && in[i] > 0) out[atomicAggInc(count)] = in[i];
}
"""

# legacy warp-synchronous code on volatile shared memory: compiled with the ThreadSanitizer hooks
VOLATILE_REDUCE = r"""
extern "C" __global__ void warp_sum(const float* in, float* out) {
    __shared__ volatile float s[64];
    int t = threadIdx.x;
    s[t] = in[t];
    s[t + 32] = 0.0f;
    s[t] += s[t + 16]; s[t] += s[t + 8]; s[t] += s[t + 4]; s[t] += s[t + 2]; s[t] += s[t + 1];
    if (t == 0) out[0] = s[0];
}
"""


def test_clang_builds_and_runs_plain_and_volatile_sources(clang, no_hazards):
    # before: clang refused g++'s -fno-gnu-unique ("unknown argument"), so nothing built; a volatile
    # source then recursed without end in its ThreadSanitizer hooks (clang instruments the atomics of
    # a no_sanitize_thread function), and <cuda_fp16.h> did not compile with clang 14 on x86-64
    # (no _Float16 there)
    x = np.arange(4 * 256, dtype=np.float32) % 7
    out = np.zeros(4, np.float32)
    halves = np.zeros(4, np.float16)
    module(REDUCE).get_function("block_sum")((4,), (256,), (x, out, halves))
    expect = x.reshape(4, 256).sum(axis=1)
    np.testing.assert_array_equal(out, expect)
    np.testing.assert_array_equal(halves, (expect / np.float32(3)).astype(np.float16))

    x = np.arange(32, dtype=np.float32)
    out = np.zeros(1, np.float32)
    module(VOLATILE_REDUCE).get_function("warp_sum")((1,), (32,), (x, out))
    assert out[0] == x.sum()


def test_a_source_built_with_g_plus_plus_is_built_again_with_clang_in_the_same_process(clang, monkeypatch):
    # before: RawModule's in-process memo keyed on the source and options only, so once a source was
    # built, setting CXX (or LLMCUPY_SIM_ASAN, or the cache folder) in a running process reused the old
    # library: this file's tests ran the second clang's checks on the first one's build
    code = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] += 1; }  // built by two compilers\n"
    with_clang = module(code)._sim_library.path
    monkeypatch.setenv("CXX", "g++")
    with_gxx = module(code)._sim_library.path
    assert with_clang != with_gxx
    monkeypatch.setenv("CXX", clang)
    assert module(code)._sim_library.path == with_clang


def test_clang_keeps_a_branch_only_some_lanes_take_before_a_shuffle(clang, no_hazards):
    # before: warp_res, unset outside the leader lane, is undefined in C++; clang assumed every lane
    # was the leader, each ran the atomicAdd, and the count (and the indices) ran past the array
    x = np.random.default_rng(2).integers(-5, 5, 5000).astype(np.int32)
    out = np.zeros(5000, np.int32)
    count = np.zeros(1, np.int32)
    module(AGGREGATED).get_function("filter")((20,), (256,), (x, out, count, np.int32(5000)))
    assert count[0] == (x > 0).sum()
    assert sorted(out[:count[0]]) == sorted(x[x > 0])


RACY = r"""
extern "C" __global__ void shift(const float* in, float* out) {
    __shared__ float s[64];
    int t = threadIdx.x;
    s[t] = in[t];
    out[t] = s[(t + 1) % 64];   // no __syncthreads: reads a neighbour's write
}
"""

CLEAN = r"""
extern "C" __global__ void shift(const float* in, float* out) {
    __shared__ float s[64];
    int t = threadIdx.x;
    s[t] = in[t];
    __syncthreads();
    out[t] = s[(t + 1) % 64];
}
"""


VECTOR_COPY = r"""
extern "C" __global__ void copy4(float* out, const float* in) {
    int i = threadIdx.x;
    float4 v = reinterpret_cast<const float4*>(in)[i];
    reinterpret_cast<float4*>(out)[i] = v;
}
"""


def test_clang_builds_the_sanitizers_and_they_see_every_access_or_it_says_why_not(clang):
    # before: clang's instrumented library crashed while loading (its hooks called themselves); then
    # memcheck reported the launch's own copy of the arguments, read inside std::apply, as the
    # kernel's "invalid 8-byte read ... at invoke.h"; and a float4 copy, which clang instruments as a
    # memcpy call, went unseen: memcheck passed one past an array's end, initcheck reported memory a
    # hidden memset had written (layernorm_backward 10)
    x = np.arange(64, dtype=np.float32)
    out = np.zeros(64, np.float32)
    if not sim_platform.clang_instruments_copies(clang):
        with sim.settings(check="all"), pytest.raises(compiler.CompilerNotFound,
                                                      match=r"the sanitizers .* cannot be built with .*a struct copy "
                                                            r"\(a float4\) into a memcpy call.*set CXX=g\+\+"):
            module(CLEAN).get_function("shift")((1,), (64,), (x, out))
        return
    with sim.settings(check="all"):
        module(CLEAN, filename="clean.cu").get_function("shift")((1,), (64,), (x, out))
    np.testing.assert_array_equal(out, np.roll(x, -1))
    with sim.settings(check="race"), pytest.raises(sim.SimSanitizerError) as info:
        module(RACY, filename="racy.cu").get_function("shift")((1,), (64,), (x, out))
    assert "racy.cu:6" in str(info.value) and "racy.cu:5" in str(info.value)
    # a float4 copy past the end of the input: a memcpy call to clang, seen all the same (at the load's
    # line or, where clang merges the load and the store into one call, the store's)
    with sim.settings(check="memory"), pytest.raises(sim.SimSanitizerError,
                                                     match=r"invalid 16-byte read .* at copy\.cu:[45].*argument 1"):
        module(VECTOR_COPY, filename="copy.cu").get_function("copy4")((1,), (9,), (np.zeros(36, np.float32),
                                                                                 np.arange(32, dtype=np.float32)))


def test_clang_sizes_the_fiber_stack_and_reports_a_float_cast_by_line(clang, no_hazards):
    # -fstack-usage is clang's too: a 96 KiB local array gets its stack; the float-cast-overflow
    # check's data (location, types) is laid out by clang as by g++
    code = r"""
    extern "C" __global__ void big(float* out, const float* x) {
        float local[24576];
        for (int i = 0; i < 24576; ++i) local[i] = x[0] * i;
        out[threadIdx.x] = local[24575 - threadIdx.x] + (float)(unsigned)x[1];
    }
    """
    out = np.zeros(32, np.float32)
    k = module(code, filename="big.cu").get_function("big")
    k((1,), (32,), (out, np.array([1, 2], np.float32)))
    np.testing.assert_array_equal(out, 24575 - np.arange(32, dtype=np.float32) + 2)
    with pytest.raises(sim.SimLaunchError, match=r"'float' to 'unsigned int' at big\.cu:5"):
        k((1,), (32,), (out, np.array([1, -1], np.float32)))


def test_clang_names_a_cuda_feature_the_emulator_lacks(clang):
    with pytest.raises(sim.SimCompileError, match="'tex1Dfetch': texture objects are not emulated"):
        module("__global__ void k(cudaTextureObject_t t, float* o) { o[0] = tex1Dfetch<float>(t, 0); }")


def test_the_address_sanitizer_build_with_clang_says_to_use_gxx(clang, monkeypatch):
    # before: clang's link failed on its own missing runtime archives, a message naming neither
    monkeypatch.setenv("LLMCUPY_SIM_ASAN", "1")
    with pytest.raises(compiler.CompilerNotFound, match=r"AddressSanitizer build \(LLMCUPY_SIM_ASAN\) is made with "
                                                        r"g\+\+.*set CXX=g\+\+ or unset LLMCUPY_SIM_ASAN"):
        module("__global__ void k(float* x) { x[0] = 1; }")


@pytest.mark.parametrize("stderr, name", [
    # g++
    ("kernel.cu:1:19: error: 'tex1Dfetch' was not declared in this scope", "tex1Dfetch"),
    # clang, also Apple's g++
    ("kernel.cu:1:19: error: unknown type name 'cudaLaunchParams'", "cudaLaunchParams"),
    ("kernel.cu:1:38: error: use of undeclared identifier 'cudaMalloc'", "cudaMalloc"),
    # a host C-library macro NVRTC lacks (sim.compiler.MACROS_NVRTC_LACKS), in both wordings
    ("kernel.cu:1:45: error: 'INFINITY' was not declared in this scope", "INFINITY"),
    ("kernel.cu:1:45: error: use of undeclared identifier 'FLT_MAX'", "FLT_MAX"),
])
def test_undeclared_cuda_names_are_read_in_either_compilers_wording(stderr, name):
    # before: only g++'s wording was read, so with clang the hint that names the missing feature was lost
    assert compiler._unsupported_features(stderr).startswith(f"'{name}': ")


@pytest.mark.parametrize("refusal", [
    "g++: error: unrecognized command-line option '-fno-gnu-unique'",
    "clang: error: unknown argument: '-fstack-usage'",
    "clang (LLVM option parsing): Unknown command line argument '-tsan-distinguish-volatile=1'.",
])
def test_a_compiler_that_refuses_the_emulators_options_is_named_with_what_to_use(refusal, tmp_path, monkeypatch):
    # before: the compiler's one line, read as the kernel's compile error
    fake = tmp_path / "old-c++"
    fake.write_text("#!/bin/sh\n"
                    'if [ "$1" = "--version" ]; then echo "old-c++ 4.2"; exit 0; fi\n'
                    f"echo \"{refusal}\" >&2; exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    monkeypatch.setenv("LLMCUPY_CACHE_DIR", str(tmp_path))
    option = refusal.split("'")[1]
    with pytest.raises(compiler.CompilerNotFound, match=rf"old-c\+\+ \(old-c\+\+ 4\.2\) does not take the option "
                                                        rf"{re.escape(option)}, .*g\+\+ 11 or newer, or clang 14 or "
                                                        r"newer.*set CXX"):
        module("__global__ void k(float* x) { x[0] = 1; }")
    # a source's own error is no refused option
    sim_platform.refused_option("g++", "kernel.cu:3:5: error: 'undefined_name' was not declared in this scope")


HALF_CONVERSIONS = r"""
#include <cuda_fp16.h>
extern "C" __global__ void to_half(const float* x, unsigned short* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __half_as_ushort(__float2half(x[i]));
}
extern "C" __global__ void from_half(const unsigned short* bits, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __half2float(__ushort_as_half(bits[i]));
}
"""


@pytest.mark.parametrize("options", [(), ("-DLLMCUPY_SIM_SOFT_HALF",)], ids=["compiler", "integer"])
def test_half_conversions_round_to_nearest_even_in_both_implementations(options):
    # the integer conversions stand in where the compiler has no _Float16 (clang 14 on x86-64, g++ 11)
    mod = module(HALF_CONVERSIONS, options=options)
    every = np.arange(1 << 16, dtype=np.uint16)
    floats = np.zeros(every.size, np.float32)
    mod.get_function("from_half")((every.size // 256,), (256,), (every, floats, np.int32(every.size)))
    want = every.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(floats[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert np.isnan(floats[nan]).all()
    # every half, the midpoints between neighbours (ties: to even), a step either side of them,
    # overflow and underflow edges, and random floats of every magnitude
    finite = np.sort(want[~nan & np.isfinite(want)].astype(np.float64))
    mids = ((finite[1:] + finite[:-1]) / 2).astype(np.float32)
    rng = np.random.default_rng(0)
    x = np.concatenate([want[~nan], mids, np.nextafter(mids, np.float32(np.inf)),
                        np.nextafter(mids, np.float32(-np.inf)),
                        np.array([65504, 65519.99, 65520, 1e9, 2 ** -24, 2 ** -25, 2 ** -25 * 1.0001, 2 ** -26, 1e-30,
                                  np.inf, -np.inf], np.float32),
                        rng.integers(0, 1 << 32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32)])
    x = x[~np.isnan(x)].astype(np.float32)
    x = np.concatenate([x, -x])
    bits = np.zeros(x.size, np.uint16)
    mod.get_function("to_half")(((x.size + 255) // 256,), (256,), (x, bits, np.int32(x.size)))
    with np.errstate(over="ignore"):
        expect = x.astype(np.float16).view(np.uint16)
    bad = np.flatnonzero(bits != expect)
    assert bad.size == 0, [(float(x[i]), hex(bits[i]), hex(expect[i])) for i in bad[:5]]
    nan_bits = np.zeros(2, np.uint16)
    mod.get_function("to_half")((1,), (32,), (np.array([np.nan, -np.nan], np.float32), nan_bits, np.int32(2)))
    assert np.isnan(nan_bits.view(np.float16)).all()


# --- platforms ---------------------------------------------------------------------------------

@pytest.mark.parametrize("system", ["win32", "cygwin"])
def test_windows_is_refused_in_one_line_naming_wsl(system, monkeypatch):
    # before: the build went ahead and failed on the first POSIX call (or on a missing g++)
    monkeypatch.setattr(sys, "platform", system)
    with pytest.raises(sim_platform.UnsupportedPlatform, match=r"runs on Linux and macOS only.*inside WSL"):
        module(f"// {system}\n__global__ void k(float* x) {{ x[0] = 1; }}\n")


def test_import_does_not_open_the_c_library_which_windows_lacks():
    # before: `import llmcupy` ran ctypes.CDLL(None) (sim/launcher.py), which raises on Windows, so
    # even the cuda backend could not be imported there
    script = textwrap.dedent("""
        import ctypes
        real = ctypes.CDLL
        def windows_like(name, *args, **kwargs):
            if name is None:
                raise TypeError("LoadLibrary() argument 1 must be str, not None")
            return real(name, *args, **kwargs)
        ctypes.CDLL = windows_like
        import llmcupy, llmcupy.sim.launcher
        print("imported")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.stdout.strip() == "imported", proc.stderr


@pytest.mark.parametrize("system, machine, said", [
    ("darwin", "arm64", "has not been run on macOS"),
    ("linux", "aarch64", "checked under qemu, not on hardware"),
    ("freebsd14", "amd64", "has not been checked on freebsd14 amd64"),
])
def test_an_unchecked_platform_is_named_once_per_process(monkeypatch, tmp_path, system, machine, said):
    # before: nothing said; a failure there came without a word that the platform was never checked
    monkeypatch.setattr(sim_platform, "_said", False)
    monkeypatch.setattr(sys, "platform", system)
    monkeypatch.setattr(sim_platform._platform, "machine", lambda: machine)
    monkeypatch.setenv("LLMCUPY_CACHE_DIR", str(tmp_path))
    code = f"// {system} {machine}\n__global__ void k(float* x) {{ x[0] = 1; }}\n"   # a build of its own
    with pytest.warns(sim_platform.SimPlatformWarning, match=said):
        module(code)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module(code + "// again\n")   # said once


def test_linux_x86_64_is_checked_and_says_nothing(monkeypatch):
    monkeypatch.setattr(sim_platform, "_said", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sim_platform.check_platform("linux", "x86_64")


def test_on_macos_the_emulator_isolates_versions_in_spawned_children(monkeypatch):
    # before: forked children, as on Linux; macOS's system libraries are not safe in a child forked
    # from a process with threads, and the emulator's workers are threads
    from llmcupy import kernel

    monkeypatch.setattr(sys, "platform", "darwin")
    assert kernel.isolation(2, "sim") == "spawn"
    monkeypatch.setattr(sys, "platform", "linux")
    assert kernel.isolation(2, "sim") == "fork"


# --- the assembly context switch on every target it is written for -------------------------------

SWITCH_USER = r"""
#include "llmcupy_sim_switch.h"
extern "C" void* use(void** save, void* next) { llmcupy_sim_switch(save, next); return (void*)&llmcupy_sim_trampoline; }
"""
SWITCH_TARGETS = {"x86_64-linux-gnu": "", "x86_64-apple-macos10.15": "_", "aarch64-linux-gnu": "",
                  "arm64-apple-macos11": "_"}


def _llvm_tool(name):
    """llvm-nm / llvm-objdump on PATH or in a Debian LLVM folder, else None."""
    found = shutil.which(name)
    if found is None:
        import glob
        found = next(iter(sorted(glob.glob(f"/usr/lib/llvm-*/bin/{name}"), reverse=True)), None)
    return found


def test_the_assembly_switch_builds_for_elf_and_macho_with_the_same_instructions(clang, tmp_path):
    # The switch runs on Linux x86-64 (everything) and aarch64 (qemu, below); on macOS it has never
    # run, so what can be checked here is checked: clang's assembler takes its Mach-O directives,
    # both functions are defined under Mach-O's names (with '_', private to the library), and their
    # instructions are the very ones of the ELF build that runs here. Before, macOS had only
    # ucontext, about ten times slower, which Apple has deprecated.
    src = tmp_path / "use.cpp"
    src.write_text(SWITCH_USER)
    nm, objdump = _llvm_tool("llvm-nm"), _llvm_tool("llvm-objdump")
    disassembly = {}
    for target, prefix in SWITCH_TARGETS.items():
        obj = tmp_path / f"{target}.o"
        proc = subprocess.run([clang, f"--target={target}", "-std=c++17", "-O2", "-nostdinc",
                               f"-I{compiler.INCLUDE_DIR}", "-c", str(src), "-o", str(obj)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (target, proc.stderr)
        if nm is not None:
            symbols = subprocess.run([nm, str(obj)], capture_output=True, text=True, check=True).stdout
            for name in ("llmcupy_sim_switch", "llmcupy_sim_trampoline"):
                assert re.search(rf"^[0-9a-f]+ T {prefix}{name}$", symbols, re.M), (target, symbols)
            assert not re.search(r" U .*llmcupy_sim", symbols), (target, symbols)
        if objdump is not None:
            text = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(obj)], capture_output=True, text=True,
                                  check=True).stdout
            # from the section's start (Mach-O's objdump labels it ltmp0, not with the switch's name)
            # to the function that uses the switch
            body = text[text.index("Disassembly of section"):text.index(f"<{prefix}use>:")]
            disassembly[target] = [line.split(None, 1)[1] for line in body.splitlines()
                                   if re.match(r"\s+[0-9a-f]+:\s", line)]
    if objdump is not None:
        assert disassembly["x86_64-linux-gnu"] == disassembly["x86_64-apple-macos10.15"]
        assert disassembly["aarch64-linux-gnu"] == disassembly["arm64-apple-macos11"]
        assert len(disassembly["aarch64-linux-gnu"]) > 30   # the switch's 30 and the trampoline's 3


def test_the_ucontext_switch_is_chosen_by_the_environment(monkeypatch, tmp_path, no_hazards):
    # the way round, should the assembly switch fail where it never ran: LLMCUPY_SIM_UCONTEXT=1
    monkeypatch.setenv("LLMCUPY_CACHE_DIR", str(tmp_path))
    code = """
    extern "C" __global__ void k(float* x) { float v = x[threadIdx.x]; __syncthreads(); x[threadIdx.x] = v + 1; }
    """
    seen = []
    real_run = subprocess.run
    def recording_run(cmd, *args, **kw):
        seen.append(list(cmd) if isinstance(cmd, (list, tuple)) else [cmd])
        return real_run(cmd, *args, **kw)
    monkeypatch.setattr(compiler.subprocess, "run", recording_run)
    for setting, expect in (("", False), ("1", True)):
        monkeypatch.setenv("LLMCUPY_SIM_UCONTEXT", setting)
        seen.clear()
        x = np.arange(64, dtype=np.float32)
        module(code).get_function("k")((1,), (64,), (x,))
        np.testing.assert_array_equal(x, np.arange(64) + 1)
        builds = [cmd for cmd in seen if any(str(c).endswith(".cu.cpp") or str(c).endswith(".cpp") for c in cmd)]
        assert builds, seen
        assert any("-DLLMCUPY_SIM_UCONTEXT" in cmd for cmd in builds) is expect, builds


# --- aarch64 -----------------------------------------------------------------------------------

AARCH64_DRIVER = r"""
#include "llmcupy_sim.h"
#include "cuda_fp16.h"
__global__ void block_sum(const float* in, float* out) {
    __shared__ float partial[32];
    float v = in[blockIdx.x * blockDim.x + threadIdx.x];
    for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) out[blockIdx.x] = v;
    }
}
__global__ void wild(float* out) { if (threadIdx.x == 5) ((float*)16)[0] = 1.0f; out[threadIdx.x] = 1.0f; }
__global__ void big_frame(int* out) { volatile char big[1 << 20]; big[threadIdx.x] = 1; out[threadIdx.x] = big[threadIdx.x * 997]; }
__global__ void spin(int* flag) { if (threadIdx.x == 0) while (*(volatile int*)flag == 0) {} }
// Many doubles and integers live across barriers (each a switch to the scheduler and back): the
// compiler keeps them in callee-saved registers (x19-x28, d8-d15), which the switch must restore.
__global__ void keeps(double* out) {
    double a = threadIdx.x, b = a + 1, c = a + 2, d = a + 3, e = a + 4, f = a + 5, g = a + 6, h = a + 7, k = a + 8;
    long i0 = threadIdx.x, i1 = i0 * 3, i2 = i0 * 5, i3 = i0 * 7, i4 = i0 * 11, i5 = i0 * 13, i6 = i0 * 17;
    for (int r = 0; r < 3; ++r) {
        __syncthreads();
        a = a * 1.5 + b; b = b * 0.5 + c; c = c + d * 0.25; d = d - e * 0.125; e = e * f * 1e-3;
        f = f + g; g = g * 2 - h; h = h + k; k = k * 0.75;
        i0 += i1; i1 ^= i2; i2 += i3 * 2; i3 -= i4; i4 += i5; i5 ^= i6 << 1; i6 += r;
        __syncthreads();
    }
    out[threadIdx.x] = a + b + c + d + e + f + g + h + k + double(i0 + i1 + i2 + i3 + i4 + i5 + i6);
}
// char is signed on a GPU; aarch64's default is unsigned (compiler.GPU_LANGUAGE_FLAGS)
__global__ void widen(const char* in, int* out) { out[threadIdx.x] = in[threadIdx.x]; }
// binary16 conversions: GCC 12 on aarch64 defines __FLT16_MANT_DIG__ but has no _Float16 in C++ (llmcupy_sim_half.h)
__global__ void halves(const float* in, unsigned short* out) { out[threadIdx.x] = __half_as_ushort(__float2half(in[threadIdx.x])); }
static double keeps_on_host(unsigned t) {
    double a = t, b = a + 1, c = a + 2, d = a + 3, e = a + 4, f = a + 5, g = a + 6, h = a + 7, k = a + 8;
    long i0 = t, i1 = i0 * 3, i2 = i0 * 5, i3 = i0 * 7, i4 = i0 * 11, i5 = i0 * 13, i6 = i0 * 17;
    for (int r = 0; r < 3; ++r) {
        a = a * 1.5 + b; b = b * 0.5 + c; c = c + d * 0.25; d = d - e * 0.125; e = e * f * 1e-3;
        f = f + g; g = g * 2 - h; h = h + k; k = k * 0.75;
        i0 += i1; i1 ^= i2; i2 += i3 * 2; i3 -= i4; i4 += i5; i5 ^= i6 << 1; i6 += r;
    }
    return a + b + c + d + e + f + g + h + k + double(i0 + i1 + i2 + i3 + i4 + i5 + i6);
}

static llmcupy_sim::LaunchConfig config(unsigned grid, unsigned block, unsigned long long timeout_ms) {
    llmcupy_sim::LaunchConfig c{};
    c.grid[0] = grid; c.grid[1] = c.grid[2] = 1;
    c.block[0] = block; c.block[1] = c.block[2] = 1;
    c.workers = 2; c.poison = 1; c.timeout_ms = timeout_ms;
    return c;
}

int main() {
    std::vector<float> in(4 * 256), sums(4);
    for (size_t i = 0; i < in.size(); ++i) in[i] = float(i % 7);
    const float* pin = in.data(); float* psums = sums.data();
    void* sum_args[] = {&pin, &psums};
    auto c = config(4, 256, 0);
    llmcupy_sim::LaunchResult r{};
    llmcupy_sim::launch(&block_sum, "block_sum", &c, sum_args, &r);
    std::printf("sums %g %g %g %g\n", sums[0], sums[1], sums[2], sums[3]);

    std::vector<float> out(64); float* pout = out.data(); void* wild_args[] = {&pout};
    c = config(2, 64, 0); r = llmcupy_sim::LaunchResult{};
    llmcupy_sim::launch(&wild, "wild", &c, wild_args, &r);
    std::printf("wild fault=%d: %s\n", r.memory_fault, r.message);

    std::vector<int> ints(32); int* pints = ints.data(); void* big_args[] = {&pints};
    c = config(1, 32, 0); r = llmcupy_sim::LaunchResult{};
    llmcupy_sim::launch(&big_frame, "big_frame", &c, big_args, &r);
    std::printf("big_frame fault=%d: %s\n", r.memory_fault, r.message);

    int flag = 0; int* pflag = &flag; void* spin_args[] = {&pflag};
    c = config(1, 32, 300); r = llmcupy_sim::LaunchResult{};
    llmcupy_sim::launch(&spin, "spin", &c, spin_args, &r);
    std::printf("spin timed_out=%d\n", r.timed_out);

    std::vector<double> kept(128); double* pkept = kept.data(); void* keeps_args[] = {&pkept};
    c = config(1, 128, 0); r = llmcupy_sim::LaunchResult{};
    llmcupy_sim::launch(&keeps, "keeps", &c, keeps_args, &r);
    int wrong = 0;
    for (unsigned t = 0; t < 128; ++t) wrong += kept[t] != keeps_on_host(t);
    std::printf("keeps wrong=%d\n", wrong);

    char bytes[2] = {char(200), char(56)}; const char* pbytes = bytes; int widened[2] = {0, 0}; int* pwidened = widened;
    void* widen_args[] = {&pbytes, &pwidened};
    c = config(1, 2, 0); r = llmcupy_sim::LaunchResult{};
    llmcupy_sim::launch(&widen, "widen", &c, widen_args, &r);
    std::printf("widen %d %d\n", widened[0], widened[1]);

    // 1 + 2^-11 ties to even (1.0), 1 + 3 * 2^-11 to 1 + 2^-9; 65520 overflows to infinity; 2^-25 rounds to zero
    float values[4] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65520.0f, 0x1p-25f}; const float* pvalues = values;
    unsigned short bits[4] = {0, 0, 0, 0}; unsigned short* pbits = bits; void* halves_args[] = {&pvalues, &pbits};
    c = config(1, 4, 0); r = llmcupy_sim::LaunchResult{};
    llmcupy_sim::launch(&halves, "halves", &c, halves_args, &r);
    std::printf("halves %04x %04x %04x %04x\n", bits[0], bits[1], bits[2], bits[3]);
    return 0;
}
"""


@pytest.mark.parametrize("switch", [(), ("-DLLMCUPY_SIM_UCONTEXT",)], ids=["asm", "ucontext"])
def test_aarch64_fibers_faults_and_the_watchdog_under_qemu(tmp_path, switch):
    # The emulator's header for aarch64 with its build flags, run under qemu-user, with either context
    # switch: the assembly one (the default; before, aarch64 had only ucontext, about ten times slower)
    # and ucontext (-DLLMCUPY_SIM_UCONTEXT, as LLMCUPY_SIM_UCONTEXT=1 builds).
    # before: a fault in kernel code killed the process there (the fiber's stack pointer was read for
    # x86-64 only), and a 1 MiB frame on a 64 KiB fiber stack wrote past the one-page guard into the
    # memory below (GCC probes aarch64 frames every 64 KiB), silently
    cross, qemu = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
    if cross is None or qemu is None:
        pytest.skip("needs aarch64-linux-gnu-g++ and qemu-aarch64 (Debian: g++-aarch64-linux-gnu, qemu-user)")
    src = tmp_path / "driver.cpp"
    src.write_text(AARCH64_DRIVER)
    exe = tmp_path / "driver"
    build = [cross, "-std=c++17", "-O2", "-fno-strict-aliasing", "-pthread", "-w", "-fstack-clash-protection",
             "-fsanitize=float-cast-overflow", "-fsanitize=integer-divide-by-zero", "-static",
             *compiler.GPU_LANGUAGE_FLAGS, *switch, f"-I{compiler.INCLUDE_DIR}", str(src), "-o", str(exe)]
    subprocess.run(build, check=True, capture_output=True, timeout=600)
    proc = subprocess.run([qemu, str(exe)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    sums = (np.arange(4 * 256) % 7).reshape(4, 256).sum(axis=1)
    assert out.startswith("sums " + " ".join(str(int(v)) for v in sums) + "\n"), out
    # two blocks run at once, on two workers: either may fault first
    assert re.search(r"wild fault=1: kernel wild crashed with SIGSEGV in block \([01],0,0\), thread \(5,0,0\)", out), out
    assert re.search(r"big_frame fault=1: kernel big_frame crashed with SIGSEGV .*: a fiber stack overflow", out), out
    assert "spin timed_out=1" in out
    assert "keeps wrong=0" in out
    assert "widen -56 56" in out   # before: "widen 200 56"
    assert "halves 3c00 3c02 7c00 0000" in out   # before: the build failed ("'_Float16' does not name a type")
