"""The emulator refuses what NVRTC refuses: small sources compiled by both, each with its verdict.

The promise: a kernel that compiles in the emulator compiles on a GPU, and the emulator's refusal
says what NVRTC would. Each table below holds sources and NVRTC's verdict, measured with NVRTC 12.4
(the oldest the test extra allows), 12.9 and 13.5 under the options CuPy gives a user's
``llmcupy.RawModule`` (``nvrtc.module_options``). The NVRTC tests compile the tables with every
NVRTC at hand (the test extra's; those of ``LLMCUPY_OLDEST_CUDA`` and ``LLMCUPY_CUDA13`` in a child
process, as in test_nvrtc.py), so a CUDA release that changes a verdict fails here; the emulator
tests check the emulator's verdict against the same tables, one compile per table.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import llmcupy
from llmcupy import nvrtc
from llmcupy.sim import compiler as sim_compiler

ROOT = Path(__file__).resolve().parents[1]
KERNEL = 'extern "C" __global__ void k(float* p) { p[threadIdx.x] = 1.0f; }\n'

# ----------------------------------------------------------------------------------------------
# NVRTC: in this process (the test extra's), or another NVRTC and its headers in a child

# (environment variable, the wheels' library and include folder), as in test_nvrtc.py
OTHER_CUDAS = {
    "oldest": ("LLMCUPY_OLDEST_CUDA", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12", "nvidia/cuda_runtime/include"),
    "cuda13": ("LLMCUPY_CUDA13", "nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cu13/include"),
}
WHICH = ["installed", *sorted(OTHER_CUDAS)]

# the child: _compile_all with another NVRTC (a second libnvrtc cannot be loaded into this process)
_CHILD = """
import json, sys
from llmcupy import nvrtc
options, out = nvrtc.module_options(80), {}
for name, code in json.load(sys.stdin).items():
    res = nvrtc.compile_source(code, 80, filename="probe.cu", options=options, name_expressions=[])
    out[name] = [res.ok, res.log]
print(json.dumps(out))
"""


def _compile_all(sources: dict) -> dict:
    """{name: (compiled, log)} with the NVRTC of this process."""
    options = nvrtc.module_options(80)
    out = {}
    for name, code in sources.items():
        res = nvrtc.compile_source(code, 80, filename="probe.cu", options=options, name_expressions=[])
        out[name] = (res.ok, res.log)
    return out


def nvrtc_verdicts(which: str, sources: dict) -> dict:
    """{name: (compiled, log)} for each source, compiled by the NVRTC ``which`` names."""
    if which == "installed":
        return _compile_all(sources)
    var, lib_rel, include_rel = OTHER_CUDAS[which]
    root = os.environ.get(var)
    if not root:
        if os.environ.get("CI") or os.environ.get("LLMCUPY_REQUIRE_NVRTC"):
            pytest.fail(f"CI must compile against the {which} NVRTC too: set {var} (.ci/run does)")
        pytest.skip(f"{var} is not set (.ci/run unpacks that NVRTC and its headers there)")
    env = dict(os.environ, LLMCUPY_NVRTC=str(Path(root) / lib_rel), LLMCUPY_CUDA_INCLUDE=str(Path(root) / include_rel),
               PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(sources), env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {name: tuple(v) for name, v in json.loads(proc.stdout.splitlines()[-1]).items()}


def test_module_options_are_cupys(have_nvrtc):
    # the premise of every verdict here: the options are the ones CuPy really passes for a RawModule
    core = pytest.importorskip("cupy._core.core")
    if not hasattr(core, "assemble_cupy_compiler_options"):
        pytest.skip("this CuPy assembles its options elsewhere")
    for user in ((), ("-DN=4",), ("--use_fast_math", "-std=c++20")):
        cupy_options = list(core.assemble_cupy_compiler_options(tuple(user))) + ["-ftz=true", "-arch=sm_80",
                                                                                 "--device-as-default-execution-space"]
        assert nvrtc.module_options(80, user) == cupy_options


# ----------------------------------------------------------------------------------------------
# host C/C++ headers: NVRTC has none of them

def _header_probe(name: str) -> str:
    return f"#include <{name}>\n{KERNEL}"


# What the refusals advise instead (sim.compiler.host_header_advice), in one kernel: it compiles
# under every NVRTC and in the emulator, and runs there.
ADVISED = r"""
#include <cuda/std/cassert>
#include <cuda/std/cmath>
#include <cuda/std/cstdint>
#include <cuda/std/cfloat>
#include <cuda/std/climits>
#include <cuda/std/cstddef>
#include <cuda/std/cstdlib>
#include <cuda/std/cstring>
#include <cuda/std/array>
#include <cuda/std/atomic>
#include <cuda/std/bit>
#include <cuda/std/complex>
#include <cuda/std/functional>
#include <cuda/std/initializer_list>
#include <cuda/std/limits>
#include <cuda/std/ratio>
#include <cuda/std/tuple>
#include <cuda/std/type_traits>
#include <cuda/std/utility>
#include <math_constants.h>
extern "C" __global__ void advised(float* p, int n) {
    assert(n > 0);                                          // built in: no header
    p[0] = sqrtf(p[1]) + expf(p[2]) + fmaxf(p[3], 1.0f) + (isnan(p[4]) ? 1.0f : 0.0f) + cuda::std::sqrt(4.0f);
    p[1] = CUDART_INF_F;
    p[2] = CUDART_NAN_F;
    uint32_t u = n;
    int64_t i = n;
    size_t s = n;
    cuda::std::size_t t = n;
    p[3] = (float)(u + i + s + t);
    p[4] = (FLT_MAX > 1e38f) + (INT_MAX > 0) + (UINT_MAX > 0u) + (FLT_EPSILON < 1e-6f);
    int a0 = 0;
    memset(p + 5, 0, sizeof(float));                         // built in
    memcpy(p + 6, p + 4, sizeof(float));
    p[7] = (float)abs(-n) + (float)cuda::std::abs(0);
    cuda::std::memcpy(&a0, &n, sizeof(int));
    p[4] += a0 - n;
    p[8] = cuda::std::numeric_limits<float>::max() > 1e38f ? cuda::std::is_same<float, float>::value : 0;
    float a = 1.0f, b = 2.0f;
    cuda::std::swap(a, b);
    p[9] = a;
}
"""


def test_nvrtc_lacks_every_host_header_the_emulator_refuses(have_nvrtc):
    # the emulator refuses each of HOST_HEADERS, saying NVRTC has none of them: true of this NVRTC
    verdicts = nvrtc_verdicts("installed", {h: _header_probe(h) for h in sim_compiler.HOST_HEADERS})
    found = [h for h, (ok, _) in verdicts.items() if ok]
    assert not found, f"NVRTC compiles these, which the emulator refuses: {found}"
    for h, (_, log) in verdicts.items():
        assert f'cannot open source file "{h}"' in log, (h, log)


@pytest.mark.parametrize("which", sorted(OTHER_CUDAS))
def test_other_supported_nvrtcs_lack_the_host_headers_too(which):
    # the message names NVRTC 12.4 to 13.5: the oldest supported and CUDA 13 (whose NVRTC has libcu++'s
    # headers built in, not the host's)
    verdicts = nvrtc_verdicts(which, {h: _header_probe(h) for h in sim_compiler.HOST_HEADERS})
    found = [h for h, (ok, _) in verdicts.items() if ok]
    assert not found, f"the {which} NVRTC compiles these, which the emulator refuses: {found}"


@pytest.mark.parametrize("which", WHICH)
def test_what_the_refusals_advise_compiles_under_nvrtc(have_nvrtc, which):
    verdicts = nvrtc_verdicts(which, {"advised": ADVISED})
    ok, log = verdicts["advised"]
    assert ok, log


def test_the_emulator_refuses_host_headers_naming_each_and_what_to_use():
    # before: the emulator compiled `#include <cmath>` (<cstdint>, <assert.h>, ...) with the host's
    # headers, and NVRTC refused the same kernel on a GPU: "cannot open source file"
    probed = ["assert.h", "cassert", "math.h", "cmath", "stdint.h", "cstdint", "stdio.h", "cstdio", "float.h",
              "cfloat", "limits.h", "climits", "string.h", "cstring", "stdlib.h", "cstdlib", "type_traits",
              "utility", "limits"]   # under clang's limit of 20 errors
    code = "".join(f"#include <{h}>\n" for h in probed) + KERNEL
    with pytest.raises(sim_compiler.SimCompileError) as info:
        llmcupy.RawModule(code=code, target="sim", filename="host.cu")
    assert set(probed) <= set(sim_compiler.HOST_HEADERS)   # the list the NVRTC tests above check
    text = str(info.value)
    for line, h in enumerate(probed, 1):
        assert f"In file included from host.cu:{line}:" in text
        assert (f"<{h}> is a host header, which NVRTC does not have (NVRTC 12.4 to 13.5: 'cannot open source "
                f"file'), so this kernel would not compile on a GPU; {sim_compiler.host_header_advice(h)}") in text, h
    assert "needs no header under NVRTC (it is built in)" in sim_compiler.host_header_advice("assert.h")
    assert "<cuda/std/cstdint>" in sim_compiler.host_header_advice("stdint.h")
    assert "<cuda/std/limits>" in sim_compiler.host_header_advice("limits")
    assert "CUDART_INF_F" in sim_compiler.host_header_advice("cmath")


def test_what_the_refusals_advise_compiles_and_runs_in_the_emulator():
    # the emulator's own headers that need the host's (cuda/std/*, cuda_pipeline.h, ...) still work
    p = np.full(10, 3.0, np.float32)
    llmcupy.RawModule(code=ADVISED, target="sim").get_function("advised")((1,), (1,), (p, np.int32(2)))
    assert p[0] == pytest.approx(np.sqrt(3) + np.exp(3) + 3 + 0 + 2, rel=1e-6)
    assert np.isinf(p[1]) and np.isnan(p[2]) and p[3] == 8 and p[4] == 4
    assert p[5] == 0 and p[6] == 4 and p[7] == 2 and p[8] == 1 and p[9] == 2


def test_a_host_header_in_the_kernels_own_header_is_refused(tmp_path):
    # NVRTC refuses <cstdint> from a header found through -I as from the source
    (tmp_path / "mine.cuh").write_text("#pragma once\n#include <cstdint>\n")
    with pytest.raises(sim_compiler.SimCompileError, match=r"(?s)In file included from .*mine\.cuh:2.*"
                                                           r"<cstdint> is a host header"):
        llmcupy.RawModule(code='#include "mine.cuh"\n' + KERNEL, options=(f"-I{tmp_path}",), target="sim")


def test_a_host_header_behind_a_guard_nvrtc_skips_is_not_refused():
    # the refusal is the preprocessor's, so code kept from NVRTC (#ifndef __CUDACC_RTC__) is kept from it too
    code = "#ifndef __CUDACC_RTC__\n#include <cmath>\n#endif\n" + KERNEL
    llmcupy.RawModule(code=code, target="sim")


# ----------------------------------------------------------------------------------------------
# warpSize: a built-in variable under NVRTC, a run-time value in a register

# (name, one line of source, NVRTC compiles it, the emulator's refusal: _WARP_SIZE_MESSAGE's
# key, or "constant" where g++ itself refuses a non-constant, or None where both compile)
WARP_SIZE = [
    ("local", "__global__ void local(int* p) { int w = warpSize; const int c = warpSize; p[0] = w + c; }", True, None),
    ("arithmetic", "__global__ void arithmetic(int* p) { for (int o = warpSize / 2; o > 0; o /= 2) "
                   "p[o] = threadIdx.x % warpSize + (p[0] & warpSize) + (p[1] && warpSize); }", True, None),
    ("reference", "__global__ void reference(int* p) { const int& r = warpSize; auto& a = warpSize; p[0] = r + a; }",
     True, None),
    ("unevaluated", "__global__ void unevaluated(int* p) { decltype(warpSize) w = 3; p[0] = sizeof(warpSize) + w; }",
     True, None),
    ("lambda", "__global__ void lambda(int* p) { auto f = [&]() { return warpSize; }; p[0] = f(); }", True, None),
    ("default_argument", "__device__ int lanes(int w = warpSize) { return w; }", True, None),
    ("member_initializer", "struct Lanes { int w = warpSize; };", True, None),
    ("size_constant", "const unsigned long WORD = sizeof(warpSize);", True, None),
    ("address", "__global__ void address(const int** p) { *p = &warpSize; }", False, "address"),
    ("address_returned", "__device__ const int* where() { return &(warpSize); }", False, "address"),
    ("static_local", "__global__ void static_local(int* p) { static int w = warpSize; p[0] = w; }", False, "static"),
    ("static_const_local", "__device__ int lanes2() { static const int w = warpSize; return w; }", False, "static"),
    ("static_array", "__device__ int lanes3() { static int w[2] = {1, warpSize}; return w[1]; }", False, "static"),
    ("namespace_const", "const int WARP = warpSize;", False, "namespace"),
    ("namespace_static", "static const int HALF_WARP = warpSize / 2;", False, "namespace"),
    ("namespace_device", "__device__ int lanes_g = warpSize;", False, "namespace"),
    ("static_member", "struct Tile { static const int w; }; const int Tile::w = warpSize;", False, "namespace"),
    ("constexpr", "constexpr int WARP_C = warpSize;", False, "constant"),
    ("array_bound", "__global__ void array_bound(int* p) { int a[warpSize]; a[0] = 1; p[0] = a[p[1]]; }", False,
     "constant"),
]


def _warp_size_source(rows):
    return "".join(line + "\n" for _, line, _, _ in rows)


@pytest.mark.parametrize("which", WHICH)
def test_nvrtc_verdicts_on_warp_size(have_nvrtc, which):
    verdicts = nvrtc_verdicts(which, {name: line + "\n" for name, line, _, _ in WARP_SIZE})
    wrong = {name: verdicts[name][1] for name, _, compiles, _ in WARP_SIZE if verdicts[name][0] != compiles}
    assert not wrong, wrong


def test_the_emulator_refuses_warp_size_where_nvrtc_does_and_only_there():
    # before: `static int w = warpSize;`, `const int W = warpSize;` at namespace scope and `&warpSize`
    # compiled and ran here, and NVRTC refused each ("dynamic initialization is not supported ...",
    # "cannot take address of builtin variable")
    refused = [row for row in WARP_SIZE if row[3] in _WARP_SIZE_MESSAGE]
    with pytest.raises(sim_compiler.SimCompileError) as info:
        llmcupy.RawModule(code=_warp_size_source(refused), target="sim", filename="warp.cu")
    errors = [line for line in str(info.value).splitlines() if ": error: " in line]
    for line, (name, _, _, why) in enumerate(refused, 1):
        said = [e for e in errors if e.startswith(f"warp.cu:{line}:")]
        assert said and _WARP_SIZE_MESSAGE[why] in said[0], (name, said)
    assert len(errors) == len(refused), errors
    accepted = [row for row in WARP_SIZE if row[3] is None]
    p = np.zeros(2, np.int32)
    mod = llmcupy.RawModule(code=_warp_size_source(accepted), target="sim")
    mod.get_function("local")((1,), (1,), (p,))
    assert p[0] == 64


_WARP_SIZE_MESSAGE = {
    "address": "cannot take the address of warpSize (NVRTC refuses it too: cannot take address of builtin "
               "variable",   # the name follows in quotes, which clang 14 shows escaped
    "static": "a static variable cannot be initialized from warpSize (NVRTC refuses it too: "
              "dynamic initialization is not supported for a function-scope static __device__ variable)",
    "namespace": "a variable at namespace scope cannot be initialized from warpSize (NVRTC "
                 "refuses it too: dynamic initialization is not supported for a __device__ variable)",
}


@pytest.mark.parametrize("name, line", [(name, line) for name, line, _, why in WARP_SIZE if why == "constant"])
def test_warp_size_where_a_constant_is_needed_is_refused_as_before(name, line):
    # g++ refuses these itself (the header's warpSize has a run-time initializer), with a hint in NVRTC's words
    with pytest.raises(sim_compiler.SimCompileError, match="NVRTC refuses it"):
        llmcupy.RawModule(code=line + "\n", target="sim", filename="warp.cu")


# ----------------------------------------------------------------------------------------------
# other C++ that g++ takes and NVRTC refuses in device code

# (name, one line of source, NVRTC compiles it, what the emulator's refusal says at that line, or None)
DEVICE_CODE = [
    ("thread_local", "thread_local int per_thread = 0;", False,
     "thread_local is not available in device code (NVRTC refuses it too: cannot use thread_local"),
    ("static_thread_local", "__device__ int counter() { static thread_local int n = 0; return ++n; }", False,
     "thread_local is not available in device code"),
    ("int128", "__device__ unsigned long long high(unsigned long long a) { return (unsigned __int128)a * a >> 64; }",
     False, '__int128 is not available in device code (NVRTC refuses it too: 128-bit integer type is only '
            'supported in Linux with the "--device-int128" flag in NVRTC)'),
    ("throw", "__global__ void throws(int* p) { if (p[0] < 0) throw 1; }", False,
     "error"),   # the compiler's own words, and the hint checked below
    ("try", "__global__ void tries(int* p) { try { p[0] = 1; } catch (...) { p[0] = 2; } }", False,
     "error"),   # the compiler's own words (g++'s, clang's), once per file: compiled alone below
    ("typeid", "__global__ void type_id(unsigned long* p) { p[0] = sizeof(typeid(p[0])); }", False,
     "error"),
    ("dynamic_cast", "struct Base { __device__ virtual ~Base() {} }; struct Derived : Base {}; "
                     "__global__ void derived(Base** b, int* p) { p[0] = dynamic_cast<Derived*>(b[0]) != nullptr; }",
     False,
     "error"),
    ("virtual", "struct Shape { __device__ virtual int sides() { return 0; } }; "
                "struct Square : Shape { __device__ int sides() override { return 4; } };", True, None),
    ("new_delete", "__global__ void heap(float* p, int n) { float* q = new float[n]; q[0] = 1; p[0] = q[0]; "
                   "delete[] q; }", True, None),
    ("recursion", "__device__ int fact(int x) { return x <= 1 ? 1 : x * fact(x - 1); }", True, None),
    ("variadic", "template <class... T> __device__ int count(T... t) { return sizeof...(t); } "
                 "__device__ int counted() { return count(1, 2.0f, 'c'); }", True, None),
    ("long_double", "__device__ float widen(int n) { long double x = n; return (float)x; }", True, None),
    ("printf_string", '__global__ void says(int n) { const char* s = "abc"; printf("%s %d\\n", s, n); }', True, None),
]


@pytest.mark.parametrize("which", WHICH)
def test_nvrtc_verdicts_on_device_code(have_nvrtc, which):
    verdicts = nvrtc_verdicts(which, {name: line + "\n" for name, line, _, _ in DEVICE_CODE})
    wrong = {name: verdicts[name][1] for name, _, compiles, _ in DEVICE_CODE if verdicts[name][0] != compiles}
    assert not wrong, wrong


def test_the_emulator_refuses_device_code_nvrtc_refuses():
    # before: each refused line compiled and ran here (g++ has thread_local, __int128, exceptions and RTTI)
    refused = [row for row in DEVICE_CODE if row[3] and row[0] != "try"]
    with pytest.raises(sim_compiler.SimCompileError) as info:
        llmcupy.RawModule(code="".join(line + "\n" for _, line, _, _ in refused), target="sim", filename="dev.cu")
    text = str(info.value)
    for line, (name, _, _, said) in enumerate(refused, 1):
        assert any(e.startswith(f"dev.cu:{line}:") and said in e for e in text.splitlines()), (name, text)
    assert "(exceptions are not CUDA: NVRTC refuses them ('device code does not support exception handling')" in text
    assert "typeid and dynamic_cast are not CUDA: NVRTC fails on them too" in text
    tries = next(row for row in DEVICE_CODE if row[0] == "try")
    with pytest.raises(sim_compiler.SimCompileError, match=r"(?s)dev.cu:1:[0-9]+: error.*exceptions are not CUDA"):
        llmcupy.RawModule(code=tries[1] + "\n", target="sim", filename="dev.cu")


def test_the_emulator_takes_the_device_code_nvrtc_takes():
    accepted = "".join(line + "\n" for _, line, _, said in DEVICE_CODE if said is None)
    llmcupy.RawModule(code=accepted, target="sim")
    # __int128 with NVRTC's option for it
    llmcupy.RawModule(code=DEVICE_CODE[2][1] + "\n", options=("--device-int128",), target="sim")


# ----------------------------------------------------------------------------------------------
# variables initialized before any thread runs: NVRTC takes only a constant initializer

# (name, source, NVRTC compiles it)
CONSTANT_INIT = [
    ("device_call", "__device__ int three() { return 3; } __device__ int from_call = three();", False),
    ("constant_call", "__device__ float two() { return 2.0f; } __constant__ float from_two = two();", False),
    ("device_constructor", "struct Counter { int v; __device__ Counter() : v(3) {} }; __device__ Counter counter;",
     False),
    ("device_make_float2", "__device__ float2 pair = make_float2(1.0f, 2.0f);", False),
    ("static_from_argument", "__global__ void from_argument(int* p, int n) { static int s = n; p[0] = s; }", False),
    ("static_from_block", "__global__ void from_block(int* p) { static unsigned s = blockDim.x; p[0] = s; }", False),
    ("device_constants", "__device__ int twelve = 3 * 4; __device__ float zeros[4]; "
                         "__constant__ float table[3] = {1, 2, 3}; __device__ float2 braced = {1.0f, 2.0f};", True),
    ("device_constexpr", "struct Seven { int v; constexpr Seven() : v(7) {} }; __device__ Seven seven; "
                         "__device__ constexpr float HALF = 0.5f;", True),
    ("static_constants", "__device__ int counted() { static int c = 0; static const float t[2] = {1, 2}; "
                         "static int z; return ++c + (int)t[1] + z; }", True),
    ("static_members", "struct Sizes { static const int w = 4; static constexpr int z = 2; }; "
                       "static __device__ int file_static = 2;", True),
    ("static_lambda", "__global__ void lambda_static(int* p) { static auto inc = [](int x) { return x + 1; }; "
                      "p[0] = inc(p[1]); }", True),
]


@pytest.mark.parametrize("which", WHICH)
def test_nvrtc_verdicts_on_constant_initialization(have_nvrtc, which):
    verdicts = nvrtc_verdicts(which, {name: line + "\n" for name, line, _ in CONSTANT_INIT})
    wrong = {name: verdicts[name][1] for name, _, compiles in CONSTANT_INIT if verdicts[name][0] != compiles}
    assert not wrong, wrong
    for name, _, compiles in CONSTANT_INIT:
        assert compiles or "dynamic initialization is not supported" in verdicts[name][1], name


def test_the_emulator_refuses_a_run_time_initializer_where_nvrtc_does():
    # before: each compiled and ran here (g++ runs the initializer at load or first use)
    refused = [line for _, line, compiles in CONSTANT_INIT if not compiles]
    with pytest.raises(sim_compiler.SimCompileError) as info:
        llmcupy.RawModule(code="".join(line + "\n" for line in refused), target="sim", filename="init.cu")
    text = str(info.value)
    for number in range(1, len(refused) + 1):
        assert re.search(rf"^init\.cu:{number}:\d+: error: .*constant initializer", text, re.M), (number, text)
    assert ("(a __device__ or __constant__ variable, or a static local, is initialized before any thread runs: "
            "NVRTC refuses a value computed at run time there ('dynamic initialization is not supported for a "
            "__device__ variable')") in text


def test_the_emulator_takes_constant_initializers():
    accepted = "".join(line + "\n" for _, line, compiles in CONSTANT_INIT if compiles)
    p = np.array([0, 41], np.int32)
    llmcupy.RawModule(code=accepted, target="sim").get_function("lambda_static")((1,), (1,), (p,))
    assert p[0] == 42


# ----------------------------------------------------------------------------------------------
# the host C library's macros (INFINITY, FLT_MAX, INT_MAX, M_PI, ...): NVRTC has none without an include

# By header, the macros of MACROS_NVRTC_LACKS it defines under NVRTC, its own and those it brings in (libcu++'s
# <cuda/std/cmath> includes its <cuda/std/cfloat> and <cuda/std/cstdint>, ...); no CUDA header has HUGE_VALF,
# M_PI, RAND_MAX, ...
_FLOAT = [m for m, what in sim_compiler.MACROS_NVRTC_LACKS.items() if what == "include <cuda/std/cfloat>"]
_LIMITS = [m for m, what in sim_compiler.MACROS_NVRTC_LACKS.items() if what == "include <cuda/std/climits>"]
_STDINT = [m for m, what in sim_compiler.MACROS_NVRTC_LACKS.items() if what == "include <cuda/std/cstdint>"]
MACROS_BY_HEADER = {
    None: [],
    "cuda/std/cmath": ["INFINITY", "NAN", *_FLOAT, *_LIMITS, *_STDINT],
    "cuda/std/cfloat": _FLOAT,
    "cuda/std/climits": _LIMITS,
    "cuda/std/cstdint": _LIMITS + _STDINT,
    "cuda/std/cstdlib": _LIMITS + _STDINT,
    "cuda/std/cstring": _LIMITS + _STDINT,
    "cuda/std/limits": _FLOAT + _LIMITS + _STDINT,
    **dict.fromkeys(("cuda/std/atomic", "cuda/std/bit", "cuda/std/array", "cuda/std/functional", "cuda/std/utility",
                     "cuda/std/tuple"), _FLOAT + _LIMITS + _STDINT),
    "cuda/std/type_traits": _LIMITS + _STDINT,
    "cuda/std/ratio": _LIMITS + _STDINT,
    "cuda/std/complex": ["INFINITY", "NAN", *_FLOAT, *_LIMITS, *_STDINT],
    "cub/block/block_reduce.cuh": ["INFINITY", "NAN", *_FLOAT, *_LIMITS, *_STDINT],
    "cub/warp/warp_reduce.cuh": ["INFINITY", "NAN", *_FLOAT, *_LIMITS, *_STDINT],
    **dict.fromkeys(("math_constants.h", "cuda/std/cassert", "cuda/std/cstddef", "cuda/std/initializer_list",
                     "cuda_fp16.h", "cuda_bf16.h", "cuda_pipeline.h", "cuComplex.h"), []),
    # not <cooperative_groups.h>: NVRTC 12.9 and 13.5 bring in <cuda/std/cfloat>'s, ... through it, 12.4 none;
    # the emulator follows the oldest, so what it compiles compiles with each
}


def _macro_uses(header) -> str:
    """A source that uses every macro of MACROS_NVRTC_LACKS, after ``header``."""
    uses = "".join(f"    p[{i}] = (double)({m});\n" for i, m in enumerate(sim_compiler.MACROS_NVRTC_LACKS))
    return (f"#include <{header}>\n" if header else "") + f'extern "C" __global__ void uses(double* p) {{\n{uses}}}\n'


@pytest.mark.parametrize("which", WHICH)
def test_nvrtc_verdicts_on_c_library_macros(have_nvrtc, which):
    verdicts = nvrtc_verdicts(which, {str(h): _macro_uses(h) for h in MACROS_BY_HEADER})
    for header, defined in MACROS_BY_HEADER.items():
        ok, log = verdicts[str(header)]
        undefined = set(re.findall(r'identifier "(\w+)" is undefined', log))
        assert not ok and undefined == set(sim_compiler.MACROS_NVRTC_LACKS) - set(defined), (header, log)


def test_the_emulator_defines_the_c_library_macros_where_nvrtc_does_and_only_there():
    # before: the host's <cmath>, <cfloat>, <climits>, ... under the emulator's header defined them all, so
    # `float m = -INFINITY;` without an include compiled here and NVRTC refused it
    macros = list(sim_compiler.MACROS_NVRTC_LACKS)
    for header, defined in MACROS_BY_HEADER.items():
        flags = "".join(f"#ifdef {m}\n    p[{i}] = 1;\n#endif\n" for i, m in enumerate(macros))
        code = (f"#include <{header}>\n" if header else "") + f"__global__ void flags(int* p) {{\n{flags}}}\n"
        p = np.zeros(len(macros), np.int32)
        llmcupy.RawModule(code=code, target="sim").get_function("flags")((1,), (1,), (p,))
        assert {m for m, f in zip(macros, p) if f} == set(defined), header


def test_the_libcuxx_macros_have_the_hosts_values_in_the_emulator():
    names = ["INFINITY", "NAN", "FLT_MAX", "FLT_MIN", "FLT_EPSILON", "FLT_TRUE_MIN", "DBL_MAX", "DBL_EPSILON",
             "INT_MIN", "UINT_MAX", "LLONG_MIN", "ULLONG_MAX", "CHAR_MIN", "INT64_MIN", "UINT64_MAX", "SIZE_MAX"]
    uses = "".join(f"    p[{i}] = (double)({m});\n" for i, m in enumerate(names))
    p = np.zeros(len(names))
    llmcupy.RawModule(code=f"#include <cuda/std/cmath>\n__global__ void values(double* p) {{\n{uses}}}\n",
                      target="sim").get_function("values")((1,), (1,), (p,))
    f32, f64 = np.finfo(np.float32), np.finfo(np.float64)
    want = [np.inf, np.nan, f32.max, f32.tiny, f32.eps, f32.smallest_subnormal, f64.max, f64.eps, -2**31, 2**32 - 1,
            -2**63, 2**64 - 1, -128, -2**63, 2**64 - 1, 2**64 - 1]
    np.testing.assert_array_equal(p, np.array(want, np.float64))


def test_a_c_library_macro_without_its_header_names_what_provides_it():
    # before: g++ compiled these (the host's headers defined them); now the compiler's "not declared" comes
    # with the header or constant that NVRTC has for each
    code = KERNEL.replace("1.0f", "-INFINITY + NAN + FLT_MAX + INT_MAX + SIZE_MAX + M_PI + HUGE_VALF + RAND_MAX")
    with pytest.raises(sim_compiler.SimCompileError) as info:
        llmcupy.RawModule(code=code, target="sim", filename="macros.cu")
    text = str(info.value)
    said = "NVRTC does not define {0} either (NVRTC 12.4 to 13.5: 'identifier \"{0}\" is undefined'): {1}"
    for name, what in [("INFINITY", "include <cuda/std/cmath>, or write CUDART_INF_F from <math_constants.h>"),
                       ("NAN", "include <cuda/std/cmath>, or write CUDART_NAN_F"),
                       ("FLT_MAX", "include <cuda/std/cfloat>"), ("INT_MAX", "include <cuda/std/climits>"),
                       ("SIZE_MAX", "include <cuda/std/cstdint>"),
                       ("M_PI", "no CUDA header defines it: write <math_constants.h>'s CUDART_* constants"),
                       ("HUGE_VALF", "no CUDA header defines it: write CUDART_INF_F"),
                       ("RAND_MAX", "no CUDA header defines it (device code has no rand() or exit())")]:
        assert re.search(r"macros\.cu:1:\d+: error: .*\b" + name + r"\b", text), (name, text)
        assert f"'{name}': " + said.format(name, what) in text, name


def test_a_c_library_macro_the_options_define_is_kept():
    # -DM_PI=... defines it under NVRTC too: the emulator's #undef of the host's leaves the user's
    p = np.zeros(1)
    mod = llmcupy.RawModule(code="__global__ void pi(double* p) { p[0] = M_PI; }\n", options=("-DM_PI=3.0",),
                            target="sim")
    mod.get_function("pi")((1,), (1,), (p,))
    assert p[0] == 3.0


# ----------------------------------------------------------------------------------------------
# std:: and the host C library's names (uint32_t, exit, strlen, ...): NVRTC has almost none of them

# (name, what precedes the kernel, its body, NVRTC compiles it: True, False, or "newer" where NVRTC 12.9 and
# 13.5 compile it and 12.4 does not, which the emulator takes)
STD_AND_C_NAMES = [
    ("std_min", "", "p[0] = std::min(p[1], p[2]);", False),
    ("std_sqrt", "", "p[0] = std::sqrt(p[1]);", False),
    ("std_abs", "", "p[0] = std::abs(p[1]);", False),
    ("std_isnan", "", "p[0] = std::isnan(p[1]);", False),
    ("std_swap", "", "std::swap(p[0], p[1]);", False),
    ("std_numeric_limits", "", "p[0] = std::numeric_limits<float>::max();", False),
    ("std_size_t", "", "std::size_t i = 0; p[i] = 1;", False),
    ("std_uint32_t", "#include <cuda/std/cstdint>\n", "std::uint32_t i = 0; p[i] = 1;", False),
    ("std_min_after_cstdint", "#include <cuda/std/cstdint>\n", "p[0] = std::min(p[1], p[2]);", False),
    ("std_move", "", "float a = std::move(p[0]); p[1] = std::forward<float&>(a);", True),
    ("std_initializer_list", "", "std::initializer_list<int> l = {1, 2}; p[0] = *l.begin();", True),
    ("using_namespace_std", "", "using namespace std; p[0] = min(p[1], p[2]);", True),
    ("users_namespace_std", "namespace std { __device__ inline float twice(float x) { return 2 * x; } }\n",
     "p[0] = std::twice(p[0]);", True),
    ("std_tuple_size", "#include <cuda/std/tuple>\n", "p[0] = std::tuple_size<cuda::std::tuple<int, int>>::value;",
     True),
    ("cuda_std_swap", "#include <cuda/std/utility>\n", "cuda::std::swap(p[0], p[1]);", True),
    ("cuda_std_without_header", "", "cuda::std::swap(p[0], p[1]);", False),
    ("cuda_std_strlen", "#include <cuda/std/cstring>\n",
     'p[0] = cuda::std::strlen("ab") + cuda::std::memcmp(p, p, 4);', True),
    ("uint32_t", "", "uint32_t x = 1; p[x] = 1;", False),
    ("int64_t", "", "int64_t x = 1; p[x] = 1;", False),
    ("uint8_t", "", "uint8_t x = 1; p[x] = 1;", False),
    ("intptr_t", "", "intptr_t x = 1; p[x] = 1;", False),
    ("uint32_t_cstdint", "#include <cuda/std/cstdint>\n",
     "uint32_t x = 1; int64_t y = 0; cuda::std::uint8_t z = 0; p[x] = y + z;", True),
    ("uint64_t_cmath", "#include <cuda/std/cmath>\n", "uint64_t x = 1; p[x] = 1;", True),
    ("uint32_t_cooperative_groups", "#include <cooperative_groups.h>\n", "uint32_t x = 1; p[x] = 1;", "newer"),
    ("uint32_t_pipeline", "#include <cuda_pipeline.h>\n", "uint32_t x = 1; uintptr_t y = 0; p[x] = y;", True),
    ("int64_t_pipeline", "#include <cuda_pipeline.h>\n", "int64_t x = 1; p[x] = 1;", False),
    ("uint32_t_fp16", "#include <cuda_fp16.h>\n", "uint32_t x = 1; p[x] = 1;", False),
    ("exit", "", "if (p[0] < 0) exit(1);", False),
    ("abort", "", "if (p[0] < 0) abort();", False),
    ("strlen", "", 'p[0] = strlen("ab");', False),
    ("memcmp", "", "p[0] = memcmp(p, p + 1, 4);", False),
    ("calloc", "", "p[0] = calloc(1, 4) != 0;", False),
    ("realloc", "", "p[0] = realloc(0, 4) != 0;", False),
    ("atoi", "", 'p[0] = atoi("1");', False),
    ("rand", "", "p[0] = rand();", False),
    ("time", "", "p[0] = time(0);", False),
    ("puts", "", 'puts("x");', False),
    ("fprintf_stderr", "", 'fprintf(stderr, "x");', False),
    ("built_in", "", 'size_t i = 0; ptrdiff_t d = 1; float* q = (float*)malloc(4); memcpy(q, p, 4); memset(q, 0, 4); '
                     'free(q); printf("%d", (int)clock()); assert(p); p[i + d] = abs(-1);', True),
]


def _names_source(prelude: str, body: str, kernel: str = "k") -> str:
    return f'{prelude}extern "C" __global__ void {kernel}(float* p) {{ {body} }}\n'


@pytest.mark.parametrize("which", WHICH)
def test_nvrtc_verdicts_on_std_and_c_library_names(have_nvrtc, which):
    verdicts = nvrtc_verdicts(which, {name: _names_source(prelude, body) for name, prelude, body, _ in STD_AND_C_NAMES})
    wrong = {name: verdicts[name][1] for name, _, _, compiles in STD_AND_C_NAMES
             if verdicts[name][0] != (which != "oldest" if compiles == "newer" else compiles)}
    assert not wrong, wrong


def test_the_emulator_refuses_std_and_c_library_names_where_nvrtc_does():
    # before: the host's <algorithm>, <cstdint>, <cstdlib>, ... under the emulator's header declared them all, so
    # std::min, uint32_t, exit(1), ... compiled and ran here, and NVRTC refused them on a GPU
    alone = [row for row in STD_AND_C_NAMES if row[3] is False and row[1]]
    together = [row for row in STD_AND_C_NAMES if row[3] is False and not row[1]]
    for start in range(0, len(together), 6):   # under clang's limit of 20 errors
        rows = together[start:start + 6]
        with pytest.raises(sim_compiler.SimCompileError) as info:
            llmcupy.RawModule(code="".join(_names_source("", body, f"k{i}") for i, (_, _, body, _) in enumerate(rows)),
                              target="sim", filename="names.cu")
        text = str(info.value)
        for line, (name, _, _, _) in enumerate(rows, 1):
            # the compiler's error at the line, or (g++) at the macro's definition with a note naming the line
            assert re.search(rf"^names\.cu:{line}:\d+: (?:error|note: in expansion of macro)", text, re.M), (name, text)
    for name, prelude, body, _ in alone:
        with pytest.raises(sim_compiler.SimCompileError, match="NVRTC"):
            llmcupy.RawModule(code=_names_source(prelude, body), target="sim", filename=f"{name}.cu")


def test_the_emulator_takes_the_std_and_c_library_names_nvrtc_takes():
    plain = [row for row in STD_AND_C_NAMES if row[3] is True and not row[1]]
    p = np.array([3, 4], np.float32)
    mod = llmcupy.RawModule(code="".join(_names_source("", body, f"k{i}") for i, (_, _, body, _) in enumerate(plain)),
                            target="sim")
    mod.get_function("k0")((1,), (1,), (p,))   # std::move, std::forward
    assert p[1] == 3
    for name, prelude, body, compiles in STD_AND_C_NAMES:
        if compiles and prelude:   # each with its header ("newer": the emulator takes what 12.9 and 13.5 take)
            llmcupy.RawModule(code=_names_source(prelude, body), target="sim", filename=f"{name}.cu").get_function("k")


def test_a_std_name_nvrtc_lacks_is_refused_naming_what_to_use():
    code = _names_source("", "p[0] = std::min(p[1], p[2]); p[1] = std::numeric_limits<float>::max();")
    with pytest.raises(sim_compiler.SimCompileError) as info:
        llmcupy.RawModule(code=code, target="sim", filename="std.cu")
    text = str(info.value)
    assert re.search(r"std\.cu:1:\d+: error: .*\bmin\b", text), text
    assert ("NVRTC has no C++ standard library: its namespace std holds only std::move, std::forward, "
            "std::initializer_list, std::align_val_t without an include (NVRTC 12.4 to 13.5: 'namespace \"std\" has "
            "no member \"min\"'") in text
    assert "for std::min: CUDA's min() and max() are built in" in text
    assert "for std::numeric_limits: cuda::std::numeric_limits after including <cuda/std/limits>" in text
    with pytest.raises(sim_compiler.SimCompileError, match=r"libcu\+\+'s namespace cuda \(cuda::std::\) needs a header, under NVRTC too"):
        llmcupy.RawModule(code=_names_source("", "cuda::std::swap(p[0], p[1]);"), target="sim")


def test_a_c_library_name_nvrtc_lacks_is_refused_naming_what_to_use():
    code = _names_source("", "uint32_t i = 0;\nif (p[i] < 0) exit(1);")
    with pytest.raises(sim_compiler.SimCompileError) as info:
        llmcupy.RawModule(code=code, target="sim", filename="c.cu")
    text = str(info.value)
    # g++ names the line in a note after the error at the rename's definition, clang in the error
    assert re.search(r"^c\.cu:1:\d+: (?:note: in expansion of macro .uint32_t.|error: .*llmcupy_nvrtc_no_uint32_t)",
                     text, re.M), text
    assert re.search(r"^c\.cu:2:\d+: (?:note: in expansion of macro .exit.|error: .*llmcupy_nvrtc_no_exit)", text,
                     re.M), text
    assert ("'uint32_t' is the host C library's, which NVRTC does not have (NVRTC 12.4 to 13.5: 'identifier "
            "\"uint32_t\" is undefined'), so this kernel would not compile on a GPU; include <cuda/std/cstdint> "
            "(also cuda::std::uint32_t), or write unsigned int") in text
    assert "'exit' is the host C library's" in text and "return from the kernel, or stop it with assert()" in text


NAMES_HEADERS = sim_compiler.INCLUDE_DIR
# the emulator's own internals, which llmcupy_sim.h includes before the kernel's source starts
_INTERNALS = {"llmcupy_sim.h", "llmcupy_sim_check.h", "llmcupy_sim_metrics.h", "llmcupy_sim_switch.h",
              "llmcupy_sim_nvrtc_names.h", "llmcupy_sim_nvrtc_names_off.h", "llmcupy_sim_nvrtc_names_on.h"}


def test_every_header_a_kernel_can_include_turns_the_renames_off_inside():
    # a header included after `#define std __llmcupy_sim_nvrtc_std` that used std:: or uint32_t itself (or
    # included a host header) would break: each turns the renames off at its top and on at its end
    checked = 0
    for path in sorted(NAMES_HEADERS.rglob("*")):
        if not path.is_file() or path.name in _INTERNALS:
            continue
        rel = "../" * (len(path.relative_to(NAMES_HEADERS).parts) - 1)
        directives = [line for line in path.read_text().splitlines() if line.startswith("#")]
        assert directives[:2] == ["#pragma once", f'#include "{rel}llmcupy_sim_nvrtc_names_off.h"'] or \
            directives[1].startswith(f'#include "{rel}llmcupy_sim_nvrtc_names_off.h"'), path
        assert directives[-1] == f'#include "{rel}llmcupy_sim_nvrtc_names_on.h"', path
        checked += 1
    assert checked > 40


def test_the_renames_list_the_same_names_everywhere():
    def names(file, pattern):
        return re.findall(pattern, (NAMES_HEADERS / file).read_text())
    expected = list(sim_compiler.NAMES_NVRTC_LACKS)
    assert names("llmcupy_sim_nvrtc_names.h", r"#define (\w+) llmcupy_nvrtc_no_\1\n") == expected
    assert names("llmcupy_sim_nvrtc_names_off.h", r'#pragma push_macro\("(\w+)"\)') == ["std", *expected]
    assert names("llmcupy_sim_nvrtc_names_on.h", r'#pragma pop_macro\("(\w+)"\)') == ["std", *expected][::-1]
    usings = names("llmcupy_sim_nvrtc_names.h", r"using ::std::(\w+);")
    assert usings == list(sim_compiler.NVRTC_STD_NAMES)
