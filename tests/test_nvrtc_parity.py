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


def test_what_the_refusals_advise_compiles_and_runs_in_the_emulator(libcuxx_mode):
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
    # NVRTC 12 asks for nvcc's --extended-lambda (an option NVRTC refuses), NVRTC 13 says "not allowed in JIT mode"
    ("device_lambda", "__global__ void twice(float* p) { auto f = [] __device__ (float x) { return 2 * x; }; "
                      "p[0] = f(p[0]); }", False,
     "a lambda cannot be marked __device__ or __host__ (NVRTC refuses it too"),
    ("host_device_lambda", "__global__ void thrice(float* p) { auto f = [=] __host__ __device__ (float x) "
                           "{ return 3 * x; }; p[0] = f(p[0]); }", False,
     "a lambda cannot be marked __device__ or __host__"),
    ("grid_constant_not_const", "struct Box { float a[4]; }; "
                                "__global__ void boxed(__grid_constant__ Box b, float* p) { p[0] = b.a[1]; }", False,
     "a parameter annotated with __grid_constant__ must have const-qualified type (NVRTC refuses it too)"),
    ("grid_constant_const_in_template_argument", "template <class T> struct Two { T a, b; }; "
     "__global__ void twos(__grid_constant__ Two<const int> q, int* p) { p[0] = q.b; }", False,
     "a parameter annotated with __grid_constant__ must have const-qualified type"),
    # NVRTC 12.4 to 13.5 take __grid_constant__ on a kernel's const parameter only
    ("grid_constant_on_device_function", "struct Cell { float a, b; }; "
                                         "__device__ float second(const __grid_constant__ Cell c) { return c.b; }", False,
     "__grid_constant__ annotation is only allowed on a parameter of a __global__ function (NVRTC refuses it too)"),
    ("grid_constant_on_unmarked_template", "template <class T> T same(const __grid_constant__ T x) { return x; }", False,
     "__grid_constant__ annotation is only allowed on a parameter of a __global__ function"),
    ("grid_constant_on_lambda", "__global__ void lambda_grid(int* p) { auto f = [] (const __grid_constant__ int x) "
                                "{ return x; }; p[0] = f(1); }", False,
     "__grid_constant__ annotation is only allowed on a parameter of a __global__ function"),
    ("grid_constant_on_local", "__global__ void local_grid(int* p) { const __grid_constant__ int n = 1; p[0] = n; }",
     False, 'attribute "grid_constant" does not apply here (NVRTC refuses it too)'),
    ("grid_constant_pointer_to_const", "__global__ void pointed(const __grid_constant__ float* p) { }", False,
     "a parameter annotated with __grid_constant__ must have const-qualified type"),
    ("cluster_bound_below_sm_90", "__global__ void __launch_bounds__(256, 2, 1) clustered(float* p) { p[0] = 1; }",
     False, "__launch_bounds__ takes a third argument (max blocks per cluster) only for sm_90 and newer (NVRTC "
            "refuses it too: cannot specify max blocks per cluster for this GPU architecture)"),
    ("maxnreg_with_launch_bounds", "__global__ void __launch_bounds__(128) __maxnreg__(32) both(float* p) "
                                   "{ p[0] = 1; }", False,
     "The __launch_bounds__ and __maxnreg__ qualifiers cannot be applied to the same kernel"),
    ("grid_constant", "struct Pair { float a, b; }; "
                      "__global__ void paired(const __grid_constant__ Pair q, float* p) { p[0] = q.b; }", True, None),
    ("grid_constant_const_after", "template <class T> struct Duo { T a, b; }; "
                                  "__global__ void duos(float* p, __grid_constant__ const Duo<int> q) { p[0] = q.b; }",
     True, None),
    ("plain_lambda_attribute", "[[nodiscard]] __device__ int kept(int x) { return x; } "
                               "__global__ void lambdas(int* p) { auto f = [] (int x) { return 2 * x; }; "
                               "p[0] = f(kept(p[1])); }", True, None),
    ("maxnreg", "__global__ void __maxnreg__(32) limited(float* p) { p[0] = 1; }", True, None),
    ("grid_constant_by_macro", "#define GRID_CONSTANT __grid_constant__\nstruct Trio { int a, b, c; }; "
                               "__global__ void trios(const GRID_CONSTANT Trio t, int* p) { p[0] = t.c; }", True, None),
    ("grid_constant_const_pointer", "__global__ void const_pointer(float* const __grid_constant__ p) { p[0] = 1; }",
     True, None),
    ("grid_constant_by_kernel_macro", "#define KERNEL_ENTRY extern \"C\" __global__\nstruct Quad { int a, b, c, d; }; "
                                      "KERNEL_ENTRY void quads(const __grid_constant__ Quad q, int* p) { p[0] = q.d; }",
     True, None),
    ("builtin_assume", "__global__ void assumed(float* p, int n) { __builtin_assume(n > 0); p[0] = n; }", True, None),
    ("brkpt", "__global__ void breaks(int n) { if (n < 0) __brkpt(); }", True, None),
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
    # the cluster bound from sm_90 on, as NVRTC takes it
    clustered = next(line for name, line, _, _ in DEVICE_CODE if name == "cluster_bound_below_sm_90")
    llmcupy.RawModule(code=clustered + "\n", options=("-arch=sm_90",), target="sim")


def test_nvrtc_takes_the_cluster_bound_from_sm_90_on(have_nvrtc):
    clustered = next(line for name, line, _, _ in DEVICE_CODE if name == "cluster_bound_below_sm_90")
    res = nvrtc.compile_source(clustered + "\n", 90, filename="probe.cu", options=nvrtc.module_options(90),
                               name_expressions=[])
    assert res.ok, res.log


# ----------------------------------------------------------------------------------------------
# declarations g++ takes as plain C++: a kernel returning a value, a function marked __host__ only

# (name, source, NVRTC's refusal (and the emulator's, at line 1, naming the function), or None: compiles)
DECLARATIONS = [
    ("returns_int", 'extern "C" __global__ int counts(float* p) { p[0] = 1; return 0; }',
     "a __global__ function must have a void return type"),
    ("returns_pointer_after_bounds", "__global__ __launch_bounds__(256) float* where(float* p) { return p; }",
     "a __global__ function must have a void return type"),
    ("returns_template_parameter", "template <class T> __global__ T first(T* p) { return p[0]; }\n"
                                   "template __global__ float first<float>(float*);",
     "a __global__ function must have a void return type"),
    ("returns_unsigned_long_long", "__global__ static unsigned long long ticks() { return 0; }",
     "a __global__ function must have a void return type"),
    ("void_by_macro", "#define KERNEL_RESULT void\n__global__ KERNEL_RESULT fills(float* p) { p[0] = 1; }", None),
    ("bounds_after_void", "__launch_bounds__(128, 2) __global__ void __noinline__ fills(float* p) { p[0] = 1; }",
     None),
    ("host_only_called", '__host__ float twice(float x) { return 2 * x; }\n'
                         'extern "C" __global__ void k(float* p) { p[0] = twice(p[0]); }',
     "a function explicitly marked as a __host__ function is not allowed in JIT mode"),
    ("host_only_uncalled", "template <class T> __host__ T twice(T x) { return 2 * x; }",
     "a function explicitly marked as a __host__ function is not allowed in JIT mode"),
    ("host_device", '__host__ __device__ float twice(float x) { return 2 * x; }\n'
                    '__device__ __host__ inline float thrice(float x) { return 3 * x; }\n'
                    'extern "C" __global__ void k(float* p) { p[0] = twice(p[0]) + thrice(p[1]); }', None),
    ("host_device_by_macro", '#define HD __host__ __device__\nHD float twice(float x) { return 2 * x; }', None),
    ("unmarked", "float twice(float x) { return 2 * x; }\n"   # a device function under CuPy's options
                 'extern "C" __global__ void k(float* p) { p[0] = twice(p[0]); }', None),
]


@pytest.mark.parametrize("which", WHICH)
def test_nvrtc_verdicts_on_declarations(have_nvrtc, which):
    verdicts = nvrtc_verdicts(which, {name: code + "\n" for name, code, _ in DECLARATIONS})
    for name, _, refusal in DECLARATIONS:
        ok, log = verdicts[name]
        assert ok == (refusal is None), (name, log)
        assert refusal is None or refusal.lower() in log.lower(), (name, log)


@pytest.mark.parametrize("name, code, refusal", DECLARATIONS, ids=[row[0] for row in DECLARATIONS])
def test_the_emulator_refuses_the_declarations_nvrtc_refuses(name, code, refusal):
    # before: g++ compiled `__global__ int k(...)` as a plain function (and the module then said "no kernel
    # 'k' in kernel.cu; kernels: none", with no word of the return type), and a __host__ function as any other
    if refusal is None:
        llmcupy.RawModule(code=code + "\n", target="sim")
        return
    with pytest.raises(sim_compiler.SimCompileError) as info:
        llmcupy.RawModule(code=code + "\n", target="sim", filename="decl.cu")
    declared = re.search(r"(?:__global__|__host__)(.*?)\(", re.sub(r"__launch_bounds__\(\w*\)", "", code))[1]
    function = re.findall(r"(\w+)\s*$", declared)[0]
    text = str(info.value)
    assert re.search(rf"decl.cu:1: error: (?:{refusal}: '{function}' returns \S|'{function}' is marked __host__ only: "
                     rf"{refusal})", text), text
    assert "(NVRTC refuses it too, in those words; " in text
    assert ("write the result through a pointer argument" if "__global__" in refusal else
            "drop __host__, or write __host__ __device__") in text


def test_a_lambda_marked_host_is_refused_as_a_lambda_not_as_a_host_function():
    code = 'extern "C" __global__ void k(float* p) { auto f = [] __host__ (float x) { return x; }; p[0] = f(1); }\n'
    with pytest.raises(sim_compiler.SimCompileError) as info:
        llmcupy.RawModule(code=code, target="sim", filename="decl.cu")
    assert "a lambda cannot be marked __device__ or __host__" in str(info.value)
    assert "marked __host__ only" not in str(info.value)


def test_each_refused_declaration_of_a_source_is_named():
    code = "".join(c + "\n" for name, c, refusal in DECLARATIONS if refusal and "template" not in c)
    with pytest.raises(sim_compiler.SimCompileError) as info:
        llmcupy.RawModule(code=code, target="sim", filename="decl.cu")
    text = str(info.value)
    assert [int(n) for n in re.findall(r"decl.cu:(\d+): error", text)] == [1, 2, 3, 4]
    assert "(NVRTC refuses them too, in those words; a kernel's launch returns nothing" in text
    assert "; a RawModule source is device code" in text


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
    # a namespace-scope variable without __device__ is a __device__ variable under CuPy's options
    ("unmarked_call", "float four() { return 4.0f; } float from_four = four();", False),
    ("unmarked_constructor", "struct Tally { int v; Tally() : v(1) {} }; Tally tally;", False),
    ("unmarked_in_namespace", "namespace inner { float five() { return 5.0f; } float from_five = five(); }", False),
    ("unmarked_static_const", "float six() { return 6.0f; } static const float from_six = six();", False),
    ("unmarked_braced", "float seven() { return 7.0f; } float2 from_seven = {seven(), 1.0f};", False),
    ("static_from_block", "__global__ void from_block(int* p) { static unsigned s = blockDim.x; p[0] = s; }", False),
    # the C library's math is no constant under NVRTC, while g++ folds a call with constant arguments (before:
    # these five compiled here)
    ("device_math", "__device__ float from_exp = expf(1.0f);", False),
    ("constant_math", "__constant__ float roots[2] = {sqrtf(2.0f), 1.0f};", False),
    ("device_abs", "__device__ int from_abs = abs(-3);", False),
    ("static_math", "__global__ void from_max(float* p) { static float s = fmaxf(1.0f, 2.0f); p[0] = s; }", False),
    ("unmarked_math", "double from_log = log(2.0);", False),
    ("device_constants", "__device__ int twelve = 3 * 4; __device__ float zeros[4]; "
                         "__constant__ float table[3] = {1, 2, 3}; __device__ float2 braced = {1.0f, 2.0f};", True),
    ("device_constexpr", "struct Seven { int v; constexpr Seven() : v(7) {} }; __device__ Seven seven; "
                         "__device__ constexpr float HALF = 0.5f;", True),
    ("static_constants", "__device__ int counted() { static int c = 0; static const float t[2] = {1, 2}; "
                         "static int z; return ++c + (int)t[1] + z; }", True),
    ("static_members", "struct Sizes { static const int w = 4; static constexpr int z = 2; }; "
                       "static __device__ int file_static = 2;", True),
    ("unmarked_constants", "float eight = 8.0f; const float nine = 9.0f; static const float pair_table[2] = {1, 2}; "
                           "float unset; constexpr float ten() { return 10.0f; } float from_ten = ten(); "
                           "struct Plain { int v; } plain; enum Shade { dark, light } shade;", True),
    ("marked_by_macro", "#define TABLE_OF __constant__\nTABLE_OF float\n    by_macro[4];", True),
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
    assert ("(a __device__ or __constant__ variable (one at namespace scope is __device__ even unmarked, under CuPy's "
            "--device-as-default-execution-space), or a static local, is initialized before any thread runs: NVRTC "
            "refuses a value computed at run time there ('dynamic initialization is not supported for a __device__ "
            "variable')") in text


def test_the_emulator_takes_constant_initializers():
    accepted = "".join(line + "\n" for _, line, compiles in CONSTANT_INIT if compiles)
    p = np.array([0, 41], np.int32)
    llmcupy.RawModule(code=accepted, target="sim").get_function("lambda_static")((1,), (1,), (p,))
    assert p[0] == 42


# ----------------------------------------------------------------------------------------------
# declared and never defined: NVRTC compiles both; a kernel is then missing from the module, and an extern
# variable is a zero-initialised definition ('warning #20044-D: extern declaration of the entity g is treated
# as a static definition')

UNDEFINED = r"""
extern "C" __global__ void declared_only(float* p);
__global__ void declared_only_cpp(float* p);
extern __device__ float never_defined;
namespace inner { extern __constant__ float never_defined_table[4]; }
extern __device__ float defined_later;
extern "C" __global__ void k(float* p) { p[0] = never_defined + inner::never_defined_table[2] + defined_later; }
__device__ float defined_later = 5.0f;
"""


@pytest.mark.parametrize("which", WHICH)
def test_nvrtc_compiles_declared_kernels_and_variables_it_never_defines(have_nvrtc, which):
    ok, log = nvrtc_verdicts(which, {"undefined": UNDEFINED})["undefined"]
    assert ok, log
    for name in ("never_defined", "inner::never_defined_table"):
        assert f"extern declaration of the entity {name} is treated as a static definition" in log, log
    assert "defined_later is treated" not in log


def test_the_emulator_runs_a_source_with_a_kernel_declared_and_never_defined():
    # before: the library did not load ('undefined symbol: declared_only', a dlopen error naming neither
    # the kernel nor the fix); now the defined kernel runs, and asking for the other says why it is not there
    mod = llmcupy.RawModule(code=UNDEFINED, target="sim", filename="undefined.cu")
    p = np.full(1, 9.0, np.float32)
    mod.get_function("k")((1,), (1,), (p,))
    assert p[0] == 5.0   # the extern variables NVRTC defines start at zero
    for name in ("declared_only", "declared_only_cpp"):
        with pytest.raises(AttributeError) as info:
            mod.get_function(name)
        assert str(info.value) == (
            f"kernel '{name}' of undefined.cu is declared but never defined (it has no body), so a GPU has no such "
            "kernel either: NVRTC compiles the source, and CuPy's get_function fails for it ('CUDA_ERROR_NOT_FOUND: "
            "named symbol not found'); define it, or launch one of the kernels the source defines: k")
    assert sim_compiler.undefined_kernel_names(UNDEFINED) == ["declared_only", "declared_only_cpp"]
    with pytest.raises(AttributeError, match="kernel 'declared_only' of kernel.cu is declared but never defined"):
        llmcupy.RawKernel(UNDEFINED, "declared_only", target="sim")


def test_a_kernel_declared_before_its_definition_is_defined():
    code = 'extern "C" __global__ void k(float* p);\nextern "C" __global__ void k(float* p) { p[0] = 2.0f; }\n'
    assert sim_compiler.undefined_kernel_names(code) == []
    p = np.zeros(1, np.float32)
    llmcupy.RawModule(code=code, target="sim").get_function("k")((1,), (1,), (p,))
    assert p[0] == 2.0


# ----------------------------------------------------------------------------------------------
# the host C library's macros (INFINITY, FLT_MAX, INT_MAX, M_PI, ...): NVRTC has none without an include

# By header, the macros of MACROS_NVRTC_LACKS it defines under NVRTC, its own and those it brings in (libcu++'s
# <cuda/std/cmath> includes its <cuda/std/cfloat> and <cuda/std/cstdint>, ...); no CUDA header has HUGE_VALF,
# M_PI, RAND_MAX, ...
_FLOAT = [m for m, what in sim_compiler.MACROS_NVRTC_LACKS.items() if what == "include <cuda/std/cfloat>"]
_LIMITS = [m for m, what in sim_compiler.MACROS_NVRTC_LACKS.items() if what == "include <cuda/std/climits>"]
_STDINT = [m for m, what in sim_compiler.MACROS_NVRTC_LACKS.items() if what == "include <cuda/std/cstdint>"]
_CSTDDEF = [m for m, what in sim_compiler.MACROS_NVRTC_LACKS.items() if what == "include <cuda/std/cstddef>"]
MACROS_BY_HEADER = {
    None: [],
    "cuda/std/cmath": ["INFINITY", "NAN", *_FLOAT, *_LIMITS, *_STDINT, *_CSTDDEF],
    "cuda/std/cfloat": _FLOAT,
    "cuda/std/climits": _LIMITS,
    "cuda/std/cstdint": _LIMITS + _STDINT,
    "cuda/std/cstddef": _CSTDDEF,
    "cuda/std/cstdlib": _LIMITS + _STDINT + _CSTDDEF,
    "cuda/std/cstring": _LIMITS + _STDINT + _CSTDDEF,
    "cuda/std/limits": _FLOAT + _LIMITS + _STDINT + _CSTDDEF,
    **dict.fromkeys(("cuda/std/atomic", "cuda/std/bit", "cuda/std/array", "cuda/std/functional", "cuda/std/utility",
                     "cuda/std/tuple"), _FLOAT + _LIMITS + _STDINT + _CSTDDEF),
    "cuda/std/type_traits": _LIMITS + _STDINT + _CSTDDEF,
    "cuda/std/ratio": _LIMITS + _STDINT,
    "cuda/std/complex": ["INFINITY", "NAN", *_FLOAT, *_LIMITS, *_STDINT, *_CSTDDEF],
    "cub/block/block_reduce.cuh": ["INFINITY", "NAN", *_FLOAT, *_LIMITS, *_STDINT, *_CSTDDEF],
    "cub/warp/warp_reduce.cuh": ["INFINITY", "NAN", *_FLOAT, *_LIMITS, *_STDINT, *_CSTDDEF],
    **dict.fromkeys(("math_constants.h", "cuda/std/cassert", "cuda/std/initializer_list",
                     "cuda_fp16.h", "cuda_bf16.h", "cuda_pipeline.h", "cuComplex.h"), []),
    # not <cooperative_groups.h>: NVRTC 12.9 and 13.5 bring in <cuda/std/cfloat>'s, ... through it, 12.4 none;
    # the emulator follows the oldest, so what it compiles compiles with each
}


def _macro_flags(header) -> str:
    """A source that warns of each macro of MACROS_NVRTC_LACKS defined after ``header`` (by #ifdef: NVRTC stops
    at 100 errors, and a use of offsetof or INT32_C would need arguments)."""
    flags = "".join(f"#ifdef {m}\n#warning defined: {m}\n#endif\n" for m in sim_compiler.MACROS_NVRTC_LACKS)
    return (f"#include <{header}>\n" if header else "") + flags + KERNEL


@pytest.mark.parametrize("which", WHICH)
def test_nvrtc_verdicts_on_c_library_macros(have_nvrtc, which):
    verdicts = nvrtc_verdicts(which, {str(h): _macro_flags(h) for h in MACROS_BY_HEADER})
    for header, defined in MACROS_BY_HEADER.items():
        ok, log = verdicts[str(header)]
        assert ok and set(re.findall(r"defined: (\w+)", log)) == set(defined), (header, log)


def test_nvrtc_refuses_the_c_library_macros_without_an_include(have_nvrtc):
    # the #ifdef probe above, seen from a use: 'identifier "EOF" is undefined' (INT32_C and offsetof need arguments)
    args = {"offsetof": "(float2, y)", **dict.fromkeys([m for m in _STDINT if m.endswith("_C")], "(1)")}
    names = [m for m in sim_compiler.MACROS_NVRTC_LACKS if m != "P_tmpdir"]   # a string
    for chunk in range(0, len(names), 80):   # NVRTC stops at 100 errors
        uses = "".join(f"    p[{i}] = (double)({m}{args.get(m, '')});\n" for i, m in enumerate(names[chunk:chunk + 80]))
        ok, log = _compile_all({"uses": f'extern "C" __global__ void uses(double* p) {{\n{uses}}}\n'})["uses"]
        assert not ok and set(names[chunk:chunk + 80]) <= set(re.findall(r'identifier "(\w+)" is undefined', log)), log


def test_the_emulator_defines_the_c_library_macros_where_nvrtc_does_and_only_there(libcuxx_mode):
    # before: the host's <cmath>, <cfloat>, <climits>, ... under the emulator's header defined them all, so
    # `float m = -INFINITY;` without an include compiled here and NVRTC refused it
    macros = list(sim_compiler.MACROS_NVRTC_LACKS)
    for header, defined in MACROS_BY_HEADER.items():
        flags = "".join(f"#ifdef {m}\n    p[{i}] = 1;\n#endif\n" for i, m in enumerate(macros))
        code = (f"#include <{header}>\n" if header else "") + f"__global__ void flags(int* p) {{\n{flags}}}\n"
        p = np.zeros(len(macros), np.int32)
        llmcupy.RawModule(code=code, target="sim").get_function("flags")((1,), (1,), (p,))
        assert {m for m, f in zip(macros, p) if f} == set(defined), header


def test_the_libcuxx_macros_have_the_hosts_values_in_the_emulator(libcuxx_mode):
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
    # before: each of these compiled here too (the host's <stdio.h>, <errno.h>, <float.h>, <stdint.h>, ...)
    code = KERNEL.replace("1.0f", "EOF + errno + LDBL_MAX + INT32_C(1) + PTRDIFF_MAX + WCHAR_MAX + PATH_MAX + "
                                  "offsetof(float2, y) + M_PIf + HUGE_VALL + FLT_DECIMAL_DIG")
    with pytest.raises(sim_compiler.SimCompileError) as info:
        llmcupy.RawModule(code=code, target="sim", filename="macros.cu")
    text = str(info.value)
    for name, what in [("EOF", "no CUDA header defines it (device code has no files or streams"),
                       ("errno", "no CUDA header defines it (device code has no errno"),
                       ("LDBL_MAX", "no CUDA header defines it (<cuda/std/cfloat> has the FLT_ and DBL_ macros only)"),
                       ("INT32_C", "include <cuda/std/cstdint>"), ("PTRDIFF_MAX", "include <cuda/std/cstdint>"),
                       ("WCHAR_MAX", "no CUDA header defines it (<cuda/std/climits> and <cuda/std/cstdint> have C's"),
                       ("PATH_MAX", "it is a host (POSIX) constant, which no CUDA header defines"),
                       ("offsetof", "include <cuda/std/cstddef>"),
                       ("M_PIf", "no CUDA header defines it: write <math_constants.h>'s CUDART_* constants"),
                       ("HUGE_VALL", "no CUDA header defines it: write CUDART_INF or CUDART_NAN"),
                       ("FLT_DECIMAL_DIG", "include <cuda/std/cfloat>")]:
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
# CUDA's min, max, abs and math functions: a fixed overload set, which refuses some calls g++'s take

# The argument types probed, by the short names the tables below use.
ARG_TYPES = {"b": "bool", "c": "char", "sc": "signed char", "uc": "unsigned char", "s": "short",
             "us": "unsigned short", "i": "int", "u": "unsigned int", "l": "long", "ul": "unsigned long",
             "ll": "long long", "ull": "unsigned long long", "f": "float", "d": "double"}


def _grid(text: str) -> dict:
    """{(a, b): result type or None} from a table: a row per first argument's type, a column per
    second's, each cell the call's result type, or "-" where NVRTC refuses the call ('more than one
    instance of overloaded function ... matches the argument list')."""
    header, *rows = [line.split() for line in text.strip().splitlines()]
    assert header == list(ARG_TYPES) and [r[0] for r in rows] == list(ARG_TYPES)
    return {(a, b): (None if cell == "-" else cell) for a, *cells in rows for b, cell in zip(header, cells)}


def _row(text: str) -> dict:
    """{(a,): result type or None} from one line of "argument:result" cells ("-": refused)."""
    cells = dict(cell.split(":") for cell in text.split())
    assert list(cells) == list(ARG_TYPES)
    return {(a,): (None if r == "-" else r) for a, r in cells.items()}


# min(a, b) and max(a, b): CUDA declares them for int, unsigned, long, unsigned long, long long,
# unsigned long long (and the signed/unsigned pairs of each size), float, double and float with double.
MIN_MAX = _grid("""
      b   c   sc  uc  s   us  i   u   l   ul  ll  ull f   d
b     i   i   i   i   i   i   i   u   -   -   -   -   -   -
c     i   i   i   i   i   i   i   u   -   -   -   -   -   -
sc    i   i   i   i   i   i   i   u   -   -   -   -   -   -
uc    i   i   i   i   i   i   i   u   -   -   -   -   -   -
s     i   i   i   i   i   i   i   u   -   -   -   -   -   -
us    i   i   i   i   i   i   i   u   -   -   -   -   -   -
i     i   i   i   i   i   i   i   u   -   -   -   -   -   -
u     u   u   u   u   u   u   u   u   -   -   -   -   -   -
l     -   -   -   -   -   -   -   -   l   ul  -   -   -   -
ul    -   -   -   -   -   -   -   -   ul  ul  -   -   -   -
ll    -   -   -   -   -   -   -   -   -   -   ll  ull -   -
ull   -   -   -   -   -   -   -   -   -   -   ull ull -   -
f     -   -   -   -   -   -   -   -   -   -   -   -   f   d
d     -   -   -   -   -   -   -   -   -   -   -   -   d   d
""")

# fmax(a, b), atan2, hypot, ...: CUDA declares a float and a double overload, so a float with an integer
# is a float, and two integers, or a float with a double, are refused
FLOAT_PAIR = _grid("""
      b   c   sc  uc  s   us  i   u   l   ul  ll  ull f   d
b     -   -   -   -   -   -   -   -   -   -   -   -   f   d
c     -   -   -   -   -   -   -   -   -   -   -   -   f   d
sc    -   -   -   -   -   -   -   -   -   -   -   -   f   d
uc    -   -   -   -   -   -   -   -   -   -   -   -   f   d
s     -   -   -   -   -   -   -   -   -   -   -   -   f   d
us    -   -   -   -   -   -   -   -   -   -   -   -   f   d
i     -   -   -   -   -   -   -   -   -   -   -   -   f   d
u     -   -   -   -   -   -   -   -   -   -   -   -   f   d
l     -   -   -   -   -   -   -   -   -   -   -   -   f   d
ul    -   -   -   -   -   -   -   -   -   -   -   -   f   d
ll    -   -   -   -   -   -   -   -   -   -   -   -   f   d
ull   -   -   -   -   -   -   -   -   -   -   -   -   f   d
f     f   f   f   f   f   f   f   f   f   f   f   f   f   -
d     d   d   d   d   d   d   d   d   d   d   d   d   -   d
""")

# pow(a, b): float and double, and each with an int exponent (so pow(x, 2) with a float x is a float)
POW = _grid("""
      b   c   sc  uc  s   us  i   u   l   ul  ll  ull f   d
b     -   -   -   -   -   -   -   -   -   -   -   -   f   d
c     -   -   -   -   -   -   -   -   -   -   -   -   f   d
sc    -   -   -   -   -   -   -   -   -   -   -   -   f   d
uc    -   -   -   -   -   -   -   -   -   -   -   -   f   d
s     -   -   -   -   -   -   -   -   -   -   -   -   f   d
us    -   -   -   -   -   -   -   -   -   -   -   -   f   d
i     -   -   -   -   -   -   -   -   -   -   -   -   f   d
u     -   -   -   -   -   -   -   -   -   -   -   -   f   d
l     -   -   -   -   -   -   -   -   -   -   -   -   f   d
ul    -   -   -   -   -   -   -   -   -   -   -   -   f   d
ll    -   -   -   -   -   -   -   -   -   -   -   -   f   d
ull   -   -   -   -   -   -   -   -   -   -   -   -   f   d
f     f   f   f   f   f   f   f   -   -   -   -   -   f   -
d     d   d   d   d   d   d   d   -   -   -   -   -   -   d
""")

# copysign(a, b): float and double, and a float with a double (a double); nothing with an integer
COPYSIGN = _grid("""
      b   c   sc  uc  s   us  i   u   l   ul  ll  ull f   d
b     -   -   -   -   -   -   -   -   -   -   -   -   -   -
c     -   -   -   -   -   -   -   -   -   -   -   -   -   -
sc    -   -   -   -   -   -   -   -   -   -   -   -   -   -
uc    -   -   -   -   -   -   -   -   -   -   -   -   -   -
s     -   -   -   -   -   -   -   -   -   -   -   -   -   -
us    -   -   -   -   -   -   -   -   -   -   -   -   -   -
i     -   -   -   -   -   -   -   -   -   -   -   -   -   -
u     -   -   -   -   -   -   -   -   -   -   -   -   -   -
l     -   -   -   -   -   -   -   -   -   -   -   -   -   -
ul    -   -   -   -   -   -   -   -   -   -   -   -   -   -
ll    -   -   -   -   -   -   -   -   -   -   -   -   -   -
ull   -   -   -   -   -   -   -   -   -   -   -   -   -   -
f     -   -   -   -   -   -   -   -   -   -   -   -   f   d
d     -   -   -   -   -   -   -   -   -   -   -   -   d   d
""")

# abs: int, long, long long, float and double (an unsigned argument is refused); labs, llabs and fabsf
# take any argument, converted
ABS = _row("b:i c:i sc:i uc:i s:i us:i i:i u:- l:l ul:- ll:ll ull:- f:f d:d")
ANY_TO = {r: _row(" ".join(f"{a}:{r}" for a in ARG_TYPES)) for r in ("i", "l", "ll", "f", "d")}
# the float and double functions of one argument (sqrt, exp, floor, ..., CUDA's rsqrt, sinpi, ...):
# an integer argument is refused, as by sqrt(2)
FLOAT_ONE = _row("b:- c:- sc:- uc:- s:- us:- i:- u:- l:- ul:- ll:- ull:- f:f d:d")
# isnan, isinf, isfinite and signbit are an int under NVRTC (not a bool)
CLASSIFY = _row("b:- c:- sc:- uc:- s:- us:- i:- u:- l:- ul:- ll:- ull:- f:i d:i")
FLOAT_ONE_FUNCTIONS = """acos acosh asin asinh atan atanh cbrt ceil cos cosh erf erfc exp exp2 expm1 fabs floor
    lgamma log log10 log1p log2 logb nearbyint rint round sin sinh sqrt tan tanh tgamma trunc
    rsqrt rcbrt sinpi cospi exp10 erfinv erfcinv normcdf normcdfinv""".split()
FLOAT_PAIR_FUNCTIONS = "fmax fmin fmod atan2 hypot fdim remainder nextafter".split()

# calls of more arguments, some of them pointers (the emulator had only the double overloads of these)
TYPE_NAMES = {**ARG_TYPES, "ip": "int*", "fp": "float*", "dp": "double*"}
MORE_ARGUMENTS = {
    "fma": {("f", "f", "f"): "f", ("d", "d", "d"): "d", ("f", "f", "i"): "f", ("i", "i", "i"): None,
            ("f", "f", "d"): None},
    "ldexp": {("f", "i"): "f", ("d", "i"): "d", ("i", "i"): None},
    "scalbn": {("f", "i"): "f", ("d", "i"): "d", ("i", "i"): None},
    "frexp": {("f", "ip"): "f", ("d", "ip"): "d", ("i", "ip"): None},
    "modf": {("f", "fp"): "f", ("d", "dp"): "d", ("f", "dp"): "d"},
    "remquo": {("f", "f", "ip"): "f", ("d", "d", "ip"): "d", ("f", "d", "ip"): None},
}

# (function, {argument types: result type or None where NVRTC refuses}), measured with NVRTC 12.4, 12.9 and 13.5
OVERLOADS = [("min", MIN_MAX), ("max", MIN_MAX), ("abs", ABS), ("labs", ANY_TO["l"]), ("llabs", ANY_TO["ll"]),
             ("fabsf", ANY_TO["f"]), ("sqrtf", ANY_TO["f"]), ("expf", ANY_TO["f"]),
             *((name, FLOAT_ONE) for name in FLOAT_ONE_FUNCTIONS),
             *((name, CLASSIFY) for name in ("isnan", "isinf", "isfinite", "signbit")),
             ("ilogb", {**FLOAT_ONE, ("f",): "i", ("d",): "i"}),
             *((name, {**FLOAT_ONE, ("f",): "l", ("d",): "l"}) for name in ("lrint", "lround")),
             *((name, {**FLOAT_ONE, ("f",): "ll", ("d",): "ll"}) for name in ("llrint", "llround")),
             *((name, FLOAT_PAIR) for name in FLOAT_PAIR_FUNCTIONS), ("pow", POW), ("copysign", COPYSIGN),
             *MORE_ARGUMENTS.items()]


def _overload_probe(overloads) -> str:
    """One source that asserts each call's result type, or that no overload takes it: a call NVRTC
    refuses is found out without an error (its decltype fails to substitute), so one compile checks a table."""
    lines = ["#include <cuda/std/type_traits>", "#include <cuda/std/utility>",
             "template <class...> struct args {};", "struct refused {};"]
    for name in dict.fromkeys(n for n, _ in overloads):
        lines += [f"template <class, class = void> struct {name}_of {{ using type = refused; }};",
                  f"template <class... A> struct {name}_of<args<A...>, cuda::std::void_t<decltype({name}("
                  f"cuda::std::declval<A>()...))>> {{ using type = decltype({name}(cuda::std::declval<A>()...)); }};"]
    for name, table in overloads:
        for argv, result in table.items():
            types = ", ".join(TYPE_NAMES[a] for a in argv)
            want = "refused" if result is None else TYPE_NAMES[result]
            lines.append(f"static_assert(cuda::std::is_same<{name}_of<args<{types}>>::type, {want}>::value, "
                         f'"{name}({types}) is {want}");')
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("which", WHICH)
def test_nvrtc_overloads_of_min_max_abs_and_math(have_nvrtc, which):
    ok, log = nvrtc_verdicts(which, {"overloads": _overload_probe(OVERLOADS)})["overloads"]
    assert ok, "\n".join(re.findall(r'static assertion failed with "(.*)"', log)) or log


def test_the_emulator_has_nvrtcs_overloads_of_min_max_abs_and_math():
    # before: min and max were one template over any two arithmetic types (std::common_type), so
    # max(1, p[1]) with a float p compiled here and NVRTC refused it, and min(short, short) was a short
    try:
        llmcupy.RawModule(code=_overload_probe(OVERLOADS), target="sim", filename="overloads.cu")
    except sim_compiler.SimCompileError as exc:
        failed = re.findall(r"static assertion failed: (.*)", str(exc))
        pytest.fail("\n".join(failed) or str(exc))


# __half and __nv_bfloat16 arguments: CUDA's half types convert to float and to every integer type, so NVRTC
# finds min, max, abs, isnan, isinf, isfinite and signbit of one ambiguous, and takes the float overload of
# fabs, sqrt, expf, fmax, ... (NVRTC 12.4, 12.9 and 13.5)
TYPE_NAMES.update({"h": "__half", "bf": "__nv_bfloat16", "bool": "bool"})
HALF_OVERLOADS = [
    *((name, {(x, x): None, (x, "f"): "f", ("f", x): "f", (x, "d"): "d", (x, "i"): None})
      for name in ("min", "max") for x in ("h", "bf")),
    *((name, {(x,): None for x in ("h", "bf")}) for name in ("abs", "isnan", "isinf", "isfinite", "signbit")),
    *((name, {(x,): "f" for x in ("h", "bf")}) for name in ("fabs", "fabsf", "sqrt", "sqrtf", "exp", "expf", "log",
                                                           "floor", "ceil", "tanh", "tanhf", "rsqrtf", "round")),
    *((name, {(x, x): "f" for x in ("h", "bf")}) for name in ("fmax", "fmaxf", "fmin")),
    ("pow", {("h", "i"): "f", ("bf", "i"): "f"}), ("fma", {("h", "h", "h"): "f", ("bf", "bf", "bf"): "f"}),
    *((name, {("h", "h"): "h", ("bf", "bf"): "bf"}) for name in ("__hmax", "__hmin")),
    *((name, {("h",): "h", ("bf",): "bf"}) for name in ("__habs", "hsqrt", "hexp")),
    ("__hisnan", {("h",): "bool", ("bf",): "bool"}), ("__hisinf", {("h",): "i", ("bf",): "i"}),
]
_HALF_PROBE = "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n" + _overload_probe(HALF_OVERLOADS)


@pytest.mark.parametrize("which", WHICH)
def test_nvrtc_overloads_for_half_arguments(have_nvrtc, which):
    ok, log = nvrtc_verdicts(which, {"half": _HALF_PROBE})["half"]
    assert ok, "\n".join(re.findall(r'static assertion failed with "(.*)"', log)) or log


def test_the_emulator_has_nvrtcs_overloads_for_half_arguments():
    # before: the emulator's __half converted to float only, so min(h, h) and abs(h) were floats and isnan(h) an
    # int here, where NVRTC refuses each
    try:
        llmcupy.RawModule(code=_HALF_PROBE, target="sim", filename="half.cu")
    except sim_compiler.SimCompileError as exc:
        failed = re.findall(r"static assertion failed: (.*)", str(exc))
        pytest.fail("\n".join(failed) or str(exc))


def test_isnan_of_a_half_is_refused_naming_what_to_write():
    code = ('#include <cuda_fp16.h>\n'
            '__global__ void flags(const __half* h, int* p) { p[0] = isnan(h[0]); p[1] = isinf(h[1]); }\n')
    with pytest.raises(sim_compiler.SimCompileError) as info:
        llmcupy.RawModule(code=code, target="sim", filename="flags.cu")
    text = str(info.value)
    assert re.search(r"flags\.cu:2:\d+: error: .*\bisnan\b", text) and re.search(r"flags\.cu:2:\d+: error: .*\bisinf\b", text)
    assert ("isnan() of a __half or __nv_bfloat16 is ambiguous under NVRTC ('more than one instance of overloaded "
            "function \"isnan\" matches the argument list': CUDA's half types convert to float and to every integer "
            "type); write __hisnan(h) or isnan(__half2float(h))") in text
    assert "isinf() of a __half or __nv_bfloat16 is ambiguous under NVRTC" in text and "write __hisinf(h) or" in text


# The integer conversions of CUDA's half types: toward zero, saturated to the type's range, NaN to 0
# (__half2int_rz, ...); to bool, nonzero (NaN is true, -0 false)
HALF_CONVERSIONS = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void half_to_integers(const float* f, long long* out) {
    __half h[5] = {__float2half(f[0]), __float2half(f[1]), __float2half(f[2]), __float2half(f[3]),
                   __float2half(f[4])};
    int i = h[0];
    short s = h[1];
    unsigned u = h[2];
    unsigned char c = h[1];
    long long n = h[3];
    out[0] = i; out[1] = s; out[2] = u; out[3] = c; out[4] = n;
    bool nonzero = h[4], nan = h[3], one = h[0];
    out[5] = nonzero; out[6] = nan; out[7] = one;
    __nv_bfloat16 b = __float2bfloat16(f[1]);
    short sb = b;
    out[8] = sb;
}
"""


@pytest.mark.parametrize("which", WHICH)
def test_the_half_conversions_kernel_compiles_under_nvrtc(have_nvrtc, which):
    ok, log = nvrtc_verdicts(which, {"half": HALF_CONVERSIONS})["half"]
    assert ok, log


def test_the_emulators_half_types_convert_to_integers_as_cudas():
    # before: only the float conversion was there, so `short s = h` of 60000 overflowed short through float
    f = np.array([-2.75, 60000.0, -3.0, np.nan, -0.0], np.float32)
    out = np.zeros(9, np.int64)
    llmcupy.RawModule(code=HALF_CONVERSIONS, target="sim").get_function("half_to_integers")((1,), (1,), (f, out))
    assert out.tolist() == [-2, 32767, 0, 255, 0, 0, 1, 1, 32767]


# Where a naive min/max (a < b ? a : b in the arguments' common type) computes otherwise than CUDA's:
# a NaN argument (fminf/fmaxf return the number), a negative int with an unsigned (CUDA converts the
# int: -1 is the largest), and a result type wider than the arguments (int for bool or unsigned char)
MIN_MAX_VALUES = r"""
extern "C" __global__ void min_max(float* f, double* d, unsigned* u, unsigned long long* w, int* i) {
    float nan = __int_as_float(0x7fc00000);
    f[0] = min(nan, 1.0f); f[1] = min(1.0f, nan); f[2] = max(nan, 1.0f); f[3] = max(1.0f, nan);
    f[4] = min(nan, nan);
    d[0] = min(1.0f, (double)nan); d[1] = max((double)nan, -1.0f);
    int minus_one = i[0];
    u[0] = min(minus_one, 1u); u[1] = max(minus_one, 1u); u[2] = min(2u, minus_one);
    w[0] = min((long long)minus_one, 1ull); w[1] = max((long)minus_one, 1ul);
    unsigned char zero = 0;
    auto m = min(zero, zero);
    m -= 1;
    i[0] = m;
    auto t = max(true, true);
    t += 1;
    i[1] = t;
}
"""


@pytest.mark.parametrize("which", WHICH)
def test_the_min_max_values_kernel_compiles_under_nvrtc(have_nvrtc, which):
    ok, log = nvrtc_verdicts(which, {"min_max": MIN_MAX_VALUES})["min_max"]
    assert ok, log


def test_the_emulators_min_max_compute_as_cudas():
    # before: min(short, short) was a short, max(bool, bool) a bool (so `m -= 1` wrapped to 255, `t += 1`
    # stayed true)
    f, d = np.zeros(5, np.float32), np.zeros(2)
    u, w, i = np.zeros(3, np.uint32), np.zeros(2, np.uint64), np.array([-1, 0], np.int32)
    llmcupy.RawModule(code=MIN_MAX_VALUES, target="sim").get_function("min_max")((1,), (1,), (f, d, u, w, i))
    assert f[:4].tolist() == [1.0, 1.0, 1.0, 1.0] and np.isnan(f[4])
    assert d.tolist() == [1.0, -1.0]
    assert u.tolist() == [1, 2**32 - 1, 2]
    assert w.tolist() == [1, 2**64 - 1]
    assert i.tolist() == [-1, 2]


def _ambiguous(line: int, name: str, gcc_args) -> str:
    """A pattern for the compiler's error at ``line`` of k.cu that the call of ``name`` is ambiguous: g++'s
    words with the arguments' types ``gcc_args``, or, where g++ only warns that ISO C++ calls it ambiguous
    (gcc_args None: a float with a double), the emulator's error in its place; or clang's words."""
    gcc = (rf"call of overloaded .{name}\({gcc_args}\). is ambiguous" if gcc_args else
           re.escape("call of overloaded function is ambiguous (ISO C++ says so and NVRTC refuses it: 'more than one "
                     "instance of overloaded function matches the argument list'")
           # g++ under -Wpedantic, which the kernel's source has (for the GNU syntax NVRTC refuses)
           + rf"|call of overloaded .{name}\((?:float&?, double|double, float&?)\). is ambiguous")
    return rf"^k\.cu:{line}:\d+: error: (?:{gcc}|call to .{name}. is ambiguous)"


def test_a_min_or_max_nvrtc_finds_ambiguous_is_refused_by_the_emulator():
    # before: max(1, p[1]) with a float p compiled here (a float), and NVRTC refused it: 'more than one
    # instance of overloaded function "max" matches the argument list'
    code = 'extern "C" __global__ void k(float* p, long n) {\n    p[0] = max(1, p[1]);\n    p[2] = min(n, 4);\n}\n'
    with pytest.raises(sim_compiler.SimCompileError) as info:
        llmcupy.RawModule(code=code, target="sim", filename="k.cu")
    text = str(info.value)
    assert re.search(_ambiguous(2, "max", r"int, float&?"), text, re.M), text
    assert re.search(_ambiguous(3, "min", r"long int&?, int"), text, re.M), text


# Where the emulator computed otherwise before it had CUDA's overloads: abs of a float or a long long
# (the C library's abs(int) truncated them), a float function of a float computed in double, pow(x, 2)
# of a float, isnan an int (not a bool), and the double functions CUDA has beside erfinvf, rcbrtf, ...
MATH_VALUES = r"""
extern "C" __global__ void math_values(float* f, double* d, long long* l, int* i) {
    f[0] = abs(-1.5f);
    d[0] = abs(-2.25);
    l[0] = abs(-3000000000ll);
    float one = f[1];
    d[1] = exp(one) - (double)expf(one);
    d[2] = sqrt(one + one) - (double)sqrtf(2.0f);
    d[3] = pow(3.1f, 2) - (double)(3.1f * 3.1f);
    auto n = isnan(__int_as_float(0x7fc00000));
    n += n;
    i[0] = n;
    i[1] = signbit(-0.0) + signbit(1.0f) + isinf(-1.0 / 0.0) + isfinite(one);
    d[4] = erfinv(0.5);
    d[5] = erfcinv(1e-20);
    d[6] = normcdfinv(0.975);
    d[7] = rcbrt(8.0);
    d[8] = copysign(2.0f, -1.0);
    f[1] = fmax(one, 3) + fma(one, 2.0f, 1);
}
"""


@pytest.mark.parametrize("which", WHICH)
def test_the_math_values_kernel_compiles_under_nvrtc(have_nvrtc, which):
    ok, log = nvrtc_verdicts(which, {"math_values": MATH_VALUES})["math_values"]
    assert ok, log


def test_the_emulators_abs_and_math_functions_compute_as_cudas():
    import math
    f, d = np.array([0, 1], np.float32), np.zeros(9)
    l, i = np.zeros(1, np.int64), np.zeros(2, np.int32)
    llmcupy.RawModule(code=MATH_VALUES, target="sim").get_function("math_values")((1,), (1,), (f, d, l, i))
    assert f[0] == 1.5 and d[0] == 2.25 and l[0] == 3000000000
    assert d[1] == 0 and d[2] == 0 and d[3] == 0   # float functions of floats, rounded to float
    assert i.tolist() == [2, 3]
    # erfinv, erfcinv, normcdfinv: bisection to the last bits of a double, so a relative 1e-14
    # (erf and erfc of the result, a few ulps from libm, give the argument back)
    assert math.erf(d[4]) == pytest.approx(0.5, rel=1e-14)
    assert math.erfc(d[5]) == pytest.approx(1e-20, rel=1e-12)   # erfc's slope there: 1e-12 holds 100 ulps of x
    assert d[6] == pytest.approx(1.959963984540054, rel=1e-14)
    assert d[7] == 0.5 and d[8] == -2.0
    assert f[1] == 3 + 3


def test_a_math_call_nvrtc_finds_ambiguous_is_refused_by_the_emulator():
    # before: each compiled here through the host's std:: templates for integers (a double), and
    # NVRTC refused it: 'more than one instance of overloaded function "sqrt" matches the argument list'
    code = ('extern "C" __global__ void k(float* p, int n, unsigned u) {\n    p[0] = sqrt(n);\n'
            '    p[1] = abs(u);\n    p[2] = fmaxf(p[0], 1) + fmax(p[0], 1.0);\n}\n')
    with pytest.raises(sim_compiler.SimCompileError) as info:
        llmcupy.RawModule(code=code, target="sim", filename="k.cu")
    text = str(info.value)
    for line, name, args in [(2, "sqrt", r"int&?"), (3, "abs", r"unsigned int&?"), (4, "fmax", None)]:
        assert re.search(_ambiguous(line, name, args), text, re.M), text
    # fmaxf(p[0], 1) is a float; fmax(float, double) g++ alone takes (it warns that ISO C++ calls it
    # ambiguous and picks the double overload): an error here too, alone in a source or among others
    assert len(re.findall(r": error: ", text)) == 3, text
    assert "convert an argument so that one overload matches, as fmaxf(x, 0.0f)" in text
    alone = 'extern "C" __global__ void k(float* p) {\n    p[0] = fmax(p[1], 0.0) + pow(p[1], 2.0);\n}\n'
    with pytest.raises(sim_compiler.SimCompileError) as info:
        llmcupy.RawModule(code=alone, target="sim", filename="k.cu")
    for name in ("fmax", "pow"):   # g++ may say it twice of one call (pow has 4 overloads)
        assert re.search(_ambiguous(2, name, None), str(info.value), re.M), (name, str(info.value))


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
    ("cuda_std_calloc", "#include <cuda/std/cstdlib>\n", "p[0] = cuda::std::calloc(1, 4) != 0;", True),
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
    # glibc declares stdin as a variable and FP_NAN, ... as enumerators besides their macros: hidden as well
    ("stdin", "", "p[0] = stdin != 0;", False),
    ("fp_categories", "", "p[0] = FP_NAN + FP_INFINITE + FP_ZERO + FP_SUBNORMAL + FP_NORMAL;", False),
    ("fp_categories_limits", "#include <cuda/std/limits>\n", "p[0] = FP_NAN + FP_ZERO;", False),
    ("fp_categories_cmath", "#include <cuda/std/cmath>\n",
     "p[0] = FP_NAN + FP_INFINITE + FP_ZERO + FP_SUBNORMAL + FP_NORMAL;", True),
    ("fp_categories_complex", "#include <cuda/std/complex>\n", "p[0] = FP_NAN + FP_NORMAL;", True),
    ("users_fp_nan", "enum Category { FP_NAN = 7 };\n", "p[0] = FP_NAN;", True),
    ("users_stdin", "__device__ int stdin = 3;\n", "p[0] = stdin;", True),
    ("fpclassify_cmath", "#include <cuda/std/cmath>\n", "p[0] = fpclassify(p[1]);", False),
    ("isunordered_cmath", "#include <cuda/std/cmath>\n", "p[0] = isunordered(p[1], p[2]);", False),
    ("comparisons", "", "p[0] = isgreater(p[1], p[2]) + isgreaterequal(p[1], p[2]) + isless(p[1], p[2]) + "
                        "islessequal(p[1], p[2]) + islessgreater(p[1], p[2]);", False),
    *[(f"{name}_cmath", "#include <cuda/std/cmath>\n", f"p[0] = {name}(p[1], p[2]);", False)
      for name in ("isgreater", "isgreaterequal", "isless", "islessequal", "islessgreater")],
    ("comparisons_limits", "#include <cuda/std/limits>\n", "p[0] = cuda::std::isgreater(p[1], p[2]);", False),
    ("cuda_std_comparisons", "#include <cuda/std/cmath>\n",
     "p[0] = cuda::std::isgreater(p[1], p[2]) + cuda::std::isgreaterequal(p[1], 2.0) + cuda::std::isless(p[1], 2) + "
     "cuda::std::islessequal(p[1], p[2]) + cuda::std::islessgreater(p[1], p[2]) + cuda::std::isunordered(p[1], p[2]);",
     True),
    ("cuda_std_comparisons_complex", "#include <cuda/std/complex>\n", "p[0] = cuda::std::isless(p[1], p[2]);", True),
    ("users_isless", "__device__ bool isless(float a, float b) { return a < b; }\n", "p[0] = isless(p[1], p[2]);",
     True),
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


def test_the_emulator_refuses_std_and_c_library_names_where_nvrtc_does(libcuxx_mode):
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


def test_the_emulator_takes_the_std_and_c_library_names_nvrtc_takes(libcuxx_mode):
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


# glibc's FP_NAN, FP_INFINITE, FP_ZERO, FP_SUBNORMAL and FP_NORMAL: NVRTC defines them (as macros) after the headers
# that bring in libcu++'s <cuda/std/cmath>, those of MACROS_BY_HEADER that define INFINITY, and after no other
_FP_CATEGORIES = ("FP_NAN", "FP_INFINITE", "FP_ZERO", "FP_SUBNORMAL", "FP_NORMAL")
FP_CATEGORY_HEADERS = {h: "INFINITY" in defined for h, defined in MACROS_BY_HEADER.items()
                       if h in (None, "cuda/std/cmath", "cuda/std/complex", "cuda/std/limits", "cuda/std/type_traits",
                                "cub/block/block_reduce.cuh", "cuda_fp16.h", "math_constants.h")}


@pytest.mark.parametrize("which", WHICH)
def test_nvrtc_defines_the_fp_categories_after_cuda_std_cmath_only(have_nvrtc, which):
    flags = "".join(f"#ifdef {m}\n#warning defined: {m}\n#endif\n" for m in _FP_CATEGORIES)
    verdicts = nvrtc_verdicts(which, {str(h): (f"#include <{h}>\n" if h else "") + flags + KERNEL
                                      for h in FP_CATEGORY_HEADERS})
    for header, defined in FP_CATEGORY_HEADERS.items():
        ok, log = verdicts[str(header)]
        assert ok and set(re.findall(r"defined: (\w+)", log)) == (set(_FP_CATEGORIES) if defined else set()), header


def test_the_emulator_has_the_fp_categories_where_nvrtc_does_and_only_there(libcuxx_mode):
    # before: glibc's enumerators (and, for want of an #undef, its macros) were there without any include
    use = "p[0] = FP_NAN + FP_INFINITE + FP_ZERO + FP_SUBNORMAL + FP_NORMAL;"
    for header, defined in FP_CATEGORY_HEADERS.items():
        code = _names_source(f"#include <{header}>\n" if header else "", use)
        if defined:
            llmcupy.RawModule(code=code, target="sim").get_function("k")
        else:
            with pytest.raises(sim_compiler.SimCompileError, match="include <cuda/std/cmath>, which defines FP_NAN"):
                llmcupy.RawModule(code=code, target="sim", filename="fp.cu")


FP_VALUES = r"""
#include <cuda/std/cmath>
extern "C" __global__ void fp_values(const float* x, int* out) {
    out[0] = FP_NAN; out[1] = FP_INFINITE; out[2] = FP_ZERO; out[3] = FP_SUBNORMAL; out[4] = FP_NORMAL;
    for (int i = 0; i < 5; i++) out[5 + i] = cuda::std::fpclassify(x[i]);
    out[10] = cuda::std::isgreater(x[4], x[2]) + 2 * cuda::std::isgreater(x[0], x[2]) + 4 * cuda::std::isless(x[2], 2)
              + 8 * cuda::std::islessgreater(x[0], x[4]) + 16 * cuda::std::isunordered(x[0], 1.0)
              + 32 * cuda::std::islessequal(x[2], x[2]) + 64 * cuda::std::isgreaterequal(x[0], x[0]);
}
"""


@pytest.mark.parametrize("which", WHICH)
def test_the_fp_values_kernel_compiles_under_nvrtc(have_nvrtc, which):
    ok, log = nvrtc_verdicts(which, {"fp_values": FP_VALUES})["fp_values"]
    assert ok, log


def test_the_fp_categories_and_comparisons_have_cudas_values_in_the_emulator(libcuxx_mode):
    # libcu++ under NVRTC: FP_NAN 0, FP_INFINITE 1, FP_ZERO 2, FP_SUBNORMAL 3, FP_NORMAL 4 (cuda/std/__cmath/fpclassify.h)
    x = np.array([np.nan, np.inf, 0.0, 1e-40, 1.5], np.float32)
    out = np.zeros(11, np.int32)
    llmcupy.RawModule(code=FP_VALUES, target="sim").get_function("fp_values")((1,), (1,), (x, out))
    assert out[:10].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]
    assert out[10] == 1 + 4 + 16 + 32   # NaN compares false, and unordered


NAMES_HEADERS = sim_compiler.INCLUDE_DIR
# the emulator's own internals, which llmcupy_sim.h includes before the kernel's source starts
_INTERNALS = {"llmcupy_sim.h", "llmcupy_sim_check.h", "llmcupy_sim_metrics.h", "llmcupy_sim_switch.h",
              "llmcupy_sim_cudart_types.h", "llmcupy_sim_nvrtc_names.h", "llmcupy_sim_nvrtc_names_off.h", "llmcupy_sim_nvrtc_names_on.h",
              # and the pieces of the real libcu++'s wrappers (test_sim_libcuxx.py checks those)
              "llmcupy_sim_libcuxx_begin.h", "llmcupy_sim_libcuxx_end.h", "llmcupy_sim_libcuxx_cudart.h"}


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
    def names(file, pattern):   # less the count of open headers (predefined macros: the host's inside)
        return [n for n in re.findall(pattern, (NAMES_HEADERS / file).read_text()) if n != "LLMCUPY_SIM_HEADER_DEPTH"]
    expected = list(sim_compiler.NAMES_NVRTC_LACKS)
    assert names("llmcupy_sim_nvrtc_names.h", r"#define (\w+) llmcupy_nvrtc_no_\1\n") == expected
    assert names("llmcupy_sim_nvrtc_names_off.h", r'#pragma push_macro\("(\w+)"\)') == ["std", *expected]
    assert names("llmcupy_sim_nvrtc_names_on.h", r'#pragma pop_macro\("(\w+)"\)') == ["std", *expected][::-1]
    usings = names("llmcupy_sim_nvrtc_names.h", r"using ::std::(\w+);")
    assert usings == list(sim_compiler.NVRTC_STD_NAMES)


# ----------------------------------------------------------------------------------------------
# CUDA's device functions: each call below compiles under every NVRTC, and in the emulator

_MODES = ("rn", "rz", "rd", "ru")
_DIRECTED = ("rz", "rd", "ru")
# one statement per function, on the kernel's parameters (f: float*, d: double*, i: int*, u: unsigned*,
# l: long long*, q: unsigned long long*)
DEVICE_FUNCTION_CALLS = [
    *(f"f[0] = __f{op}_{mode}(f[1], f[2]);" for op in ("add", "sub", "mul", "div") for mode in _MODES),
    *(f"f[0] = __f{op}_{mode}(f[1]);" for op in ("rcp", "sqrt") for mode in _MODES),
    *(f"f[0] = __fmaf_{mode}(f[1], f[2], f[3]);" for mode in _MODES),
    *(f"f[0] = __fmaf_ieee_{mode}(f[1], f[2], f[3]);" for mode in _MODES),
    *(f"d[0] = __d{op}_{mode}(d[1], d[2]);" for op in ("add", "sub", "mul", "div") for mode in _MODES),
    *(f"d[0] = __d{op}_{mode}(d[1]);" for op in ("rcp", "sqrt") for mode in _MODES),
    *(f"d[0] = __fma_{mode}(d[1], d[2], d[3]);" for mode in _MODES),
    *(f"f[0] = __{src}2float_{mode}({arg}[1]);" for src, arg in (("int", "i"), ("uint", "u"), ("ll", "l"),
                                                                  ("ull", "q"), ("double", "d")) for mode in _MODES),
    *(f"d[0] = __{src}2double_{mode}({arg}[1]);" for src, arg in (("ll", "l"), ("ull", "q")) for mode in _MODES),
    *(f"{out}[0] = __{src}2{dst}_{mode}({arg}[1]);"
      for src, arg in (("float", "f"), ("double", "d"))
      for dst, out in (("int", "i"), ("uint", "u"), ("ll", "l"), ("ull", "q")) for mode in _MODES),
    "u[0] = __fns(u[1], u[2], i[0]);",
    "f[0] = fdividef(f[1], f[2]);",
    "if (i[0] < 0) __brkpt();",
    "__builtin_assume(i[1] > 0); i[0] = i[1];",
    *(f"d[0] = {fn}(d[1]);" for fn in ("erfinv", "erfcinv", "normcdfinv", "erfcx", "rcbrt", "cyl_bessel_i0",
                                        "cyl_bessel_i1")),
    *(f"f[0] = {fn}(f[1]);" for fn in ("erfinvf", "erfcinvf", "normcdfinvf", "erfcxf", "rcbrtf", "cyl_bessel_i0f",
                                        "cyl_bessel_i1f")),
    "d[0] = norm(3, d) + rnorm(3, d) + norm3d(d[1], d[2], d[3]) + norm4d(d[1], d[2], d[3], d[4]) + rhypot(d[1], d[2]);",
    "d[0] = rnorm3d(d[1], d[2], d[3]) + rnorm4d(d[1], d[2], d[3], d[4]); sincospi(d[1], d + 2, d + 3);",
    "f[0] = normf(3, f) + rnormf(3, f) + rnorm4df(f[1], f[2], f[3], f[4]);",
    "atomicInc_block(u, 5u); atomicInc_system(u, 5u); atomicDec_block(u, 5u); atomicDec_system(u, 5u);",
    "{ cuDoubleComplex z = make_cuDoubleComplex(d[1], d[2]); d[0] = cuCreal(cuCfma(z, z, z)); }",
    "{ cuFloatComplex z = make_cuFloatComplex(f[1], f[2]); f[0] = cuCrealf(cuCfmaf(z, z, z)); }",
    # 16-bit (h: __half*, h2: __half2*, b: __nv_bfloat16*, b2: __nv_bfloat162*)
    *(f"{out}[0] = __{src}2{name}_{mode}({arg}[1]);"
      for name, out in (("half", "h"), ("bfloat16", "b"))
      for src, arg in (("float", "f"), ("int", "i"), ("uint", "u"), ("ll", "l"), ("ull", "q"), ("short", "(short)i"),
                       ("ushort", "(unsigned short)u"))
      for mode in _MODES),
    "h2[0] = make_half2(h[0], h[1]);",
    "b2[0] = make_bfloat162(b[0], b[1]);",
    *(f"{v}[0] = {fn}({v}[1]);" for v in ("h", "b") for fn in ("hexp10", "hlog10")),
    # (htanh, h2tanh and their _approx forms are not in NVRTC 12.4's headers, only from 12.8 on)
    *(f"{v}[0] = h2{fn}({v}[1]);" for v in ("h2", "b2")
      for fn in ("exp2", "exp10", "log", "log2", "log10", "rsqrt", "rcp", "sin", "cos", "floor", "ceil", "trunc",
                 "rint")),
]
_CALLS_SOURCE = ("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <cuComplex.h>\n"
                 'extern "C" __global__ void calls(float* f, double* d, int* i, unsigned* u, long long* l, '
                 "unsigned long long* q, __half* h, __half2* h2, __nv_bfloat16* b, __nv_bfloat162* b2) {\n"
                 + "".join(f"    {call}\n" for call in DEVICE_FUNCTION_CALLS) + "}\n")


@pytest.mark.parametrize("which", WHICH)
def test_nvrtc_compiles_each_device_function_call(have_nvrtc, which):
    ok, log = nvrtc_verdicts(which, {"calls": _CALLS_SOURCE})["calls"]
    assert ok, log


def test_the_emulator_compiles_each_device_function_call():
    # before: the directed-rounding forms (__fadd_rz, __dmul_ru, __ll2float_rd, __double2ull_rn, ...), __fns,
    # __brkpt and __builtin_assume were "not declared in this scope" here, though NVRTC compiles them
    llmcupy.RawModule(code=_CALLS_SOURCE, target="sim")


# ----------------------------------------------------------------------------------------------
# the CUDA runtime's types and enumerators: NVRTC declares them in every kernel without an include (its built-in
# driver_types.h, texture_types.h, library_types.h, ...), and none of the runtime's functions

# (name, the body of k(int* p), NVRTC compiles it: True, False, "12" where NVRTC 12.4 and 12.9 do and 13.5 does not,
# or "12.9+" where 12.9 and 13.5 do and 12.4 does not; the emulator refuses both, as one of the NVRTCs does)
CUDART_TYPES = [
    ("error_t", "cudaError_t e = cudaSuccess; p[0] = (int)e;", True),
    ("error_enum", "cudaError e = cudaErrorMemoryAllocation; p[0] = e;", True),
    ("error_compare", "cudaError_t e = (cudaError_t)p[1]; p[0] = e == cudaErrorLaunchFailure || e == cudaErrorAssert;",
     True),
    ("stream", "cudaStream_t s = 0; p[0] = s == 0;", True),
    ("handles", "cudaEvent_t e = 0; cudaGraph_t g = 0; cudaGraphNode_t n = 0; cudaGraphExec_t x = 0; "
                "cudaArray_t a = 0; cudaMemPool_t m = 0; cudaKernel_t k = 0; cudaFunction_t f = 0; "
                "p[0] = !e + !g + !n + !x + !a + !m + !k + !f;", True),
    ("memcpy_kind", "cudaMemcpyKind k = cudaMemcpyHostToDevice; p[0] = k;", True),
    ("device_attr", "cudaDeviceAttr a = cudaDevAttrMaxThreadsPerBlock; p[0] = a + cudaDevAttrComputeCapabilityMajor;",
     True),
    ("limit_cache_memory_type", "p[0] = cudaLimitStackSize + cudaFuncCachePreferShared + cudaMemoryTypeDevice + "
                                "cudaSharedMemBankSizeFourByte + cudaFuncAttributeMaxDynamicSharedMemorySize;", True),
    ("access_property", "cudaAccessProperty a = cudaAccessPropertyStreaming; p[0] = a;", True),
    ("capture_status", "cudaStreamCaptureStatus s = cudaStreamCaptureStatusActive; p[0] = s + cudaStreamCaptureModeRelaxed;",
     True),
    ("data_type", "cudaDataType t = CUDA_R_32F; cudaDataType_t u = CUDA_R_16BF; p[0] = t + u;", True),
    ("round_mode", "cudaRoundMode r = cudaRoundZero; p[0] = r + cudaComputeModeProhibited;", True),
    ("extent", "cudaExtent e; e.width = 1; e.height = 2; e.depth = 3; p[0] = (int)(e.width + e.height + e.depth);", True),
    ("extent_braces", "cudaExtent e = {1, 2, 3}; cudaPos q = {4, 5, 6}; p[0] = (int)(e.depth + q.z);", True),
    ("pitched_ptr", "cudaPitchedPtr q; q.ptr = p; q.pitch = 4; q.xsize = 1; q.ysize = 1; p[0] = (int)q.pitch;", True),
    ("channel_desc", "cudaChannelFormatDesc d; d.x = 8; d.f = cudaChannelFormatKindFloat; p[0] = d.x + d.f;", True),
    ("func_attributes", "cudaFuncAttributes a; a.numRegs = 3; a.maxThreadsPerBlock = 256; a.sharedSizeBytes = 0; "
                        "p[0] = a.numRegs + a.maxThreadsPerBlock + (int)a.sharedSizeBytes;", True),
    ("device_prop", "cudaDeviceProp d; d.warpSize = 32; d.major = 8; d.multiProcessorCount = 108; d.name[0] = 0; "
                    "p[0] = sizeof(cudaDeviceProp) > 0 && d.warpSize + d.major + d.multiProcessorCount;", True),
    ("uuid", "cudaUUID_t u; u.bytes[0] = 1; p[0] = sizeof(cudaUUID_t) + u.bytes[0];", True),
    # the handles of texture and surface objects are declared; reading through one is refused (below)
    ("texture_object", "cudaTextureObject_t t = 0; cudaSurfaceObject_t s = 1; p[0] = (int)(t + s + sizeof(t));", True),
    # CUDA 13 removed cudaLaunchParams and device properties such as clockRate
    ("launch_params", "p[0] = sizeof(cudaLaunchParams);", "12"),
    ("device_prop_clock_rate", "cudaDeviceProp d; d.clockRate = 1; p[0] = d.clockRate;", "12"),
    # enumerators CUDA added after 12.4
    ("newer_error", "p[0] = cudaErrorInvalidResourceType;", "12.9+"),
    ("newer_device_attr", "p[0] = cudaDevAttrGpuPciDeviceId;", "12.9+"),
    # the runtime's functions: host code; and the driver API's names
    *[(f"{name}", f"p[0] = sizeof(&{name});", False) for name in sim_compiler.CUDA_RUNTIME_FUNCTIONS],
    ("make_cuda_extent", "cudaExtent e = make_cudaExtent(1, 2, 3); p[0] = (int)e.depth;", False),
    ("make_cuda_pitched_ptr", "cudaPitchedPtr q = make_cudaPitchedPtr(p, 4, 1, 1); p[0] = (int)q.pitch;", False),
    ("make_cuda_pos", "cudaPos q = make_cudaPos(1, 2, 3); p[0] = (int)q.z;", False),
    ("cuda_version", "p[0] = CUDA_VERSION;", False),
    ("cu_result", "CUresult r = CUDA_SUCCESS; p[0] = r;", False),
]


def _cudart_source(body: str, kernel: str = "k") -> str:
    return f'extern "C" __global__ void {kernel}(int* p) {{ {body} }}\n'


CUDART_HEADER = sim_compiler.INCLUDE_DIR / "llmcupy_sim_cudart_types.h"


def _cudart_values_source() -> str:
    """A static_assert of each enumerator the emulator declares, with the emulator's value, and a sizeof of each type
    it declares: NVRTC compiles it only where it declares the same names with the same values."""
    header = re.sub(r"//[^\n]*", "", CUDART_HEADER.read_text())
    enumerators = re.findall(r"\b(\w+) = (\d+)", header)
    types = re.findall(r"typedef [^;{}]*?(\w+);", header) + re.findall(r"struct (\w+) \{", header)
    assert len(enumerators) > 250 and len(types) > 25, (len(enumerators), types)
    return "".join([*(f'static_assert({name} == {value}, "{name}");\n' for name, value in enumerators),
                    *(f'static_assert(sizeof({name}) > 0, "{name}");\n' for name in types),
                    _cudart_source("p[0] = cudaSuccess;")])


@pytest.mark.parametrize("which", WHICH)
def test_nvrtc_verdicts_on_the_cuda_runtimes_types(have_nvrtc, which):
    sources = {name: _cudart_source(body) for name, body, _ in CUDART_TYPES}
    sources["emulators_values"] = _cudart_values_source()
    sources["cudart_values"] = CUDART_VALUES
    verdicts = nvrtc_verdicts(which, sources)
    expected = {name: which != "cuda13" if compiles == "12" else which != "oldest" if compiles == "12.9+" else compiles
                for name, _, compiles in CUDART_TYPES}
    wrong = {name: verdicts[name][1] for name, compiles in expected.items() if verdicts[name][0] != compiles}
    assert not wrong, wrong
    # every enumerator and type the emulator declares, NVRTC declares, with the same value
    assert verdicts["emulators_values"][0], verdicts["emulators_values"][1][:3000]
    # the kernel the emulator runs below (test_the_emulator_gives_the_cuda_runtimes_enumerators_cudas_values)
    assert verdicts["cudart_values"][0], verdicts["cudart_values"][1]


def test_the_emulator_takes_the_cuda_runtimes_types_where_nvrtc_does_and_only_there():
    # before: "'cudaError_t' was not declared in this scope", and the same for each of these NVRTC takes
    taken = [row for row in CUDART_TYPES if row[2] is True]
    llmcupy.RawModule(code="".join(_cudart_source(body, f"k{i}") for i, (_, body, _) in enumerate(taken)),
                      target="sim", filename="cudart.cu").get_function("k0")
    llmcupy.RawModule(code=_cudart_values_source(), target="sim", filename="values.cu").get_function("k")
    for name, body, compiles in CUDART_TYPES:
        if compiles is not True:
            # each refusal says what NVRTC says, but g++'s own for a field CUDA 13 removed and the driver API's names
            said = None if name in ("device_prop_clock_rate", "cuda_version", "cu_result") else "NVRTC"
            with pytest.raises(sim_compiler.SimCompileError, match=said):
                llmcupy.RawModule(code=_cudart_source(body), target="sim", filename=f"{name}.cu")


def test_a_runtime_function_or_missing_runtime_name_is_refused_naming_what_to_do():
    for name in ("cudaGetLastError", "cudaMalloc", "cudaDeviceSynchronize", "cudaGetErrorString"):
        with pytest.raises(sim_compiler.SimCompileError) as info:
            llmcupy.RawModule(code=_cudart_source(f"p[0] = sizeof(&{name});"), target="sim", filename="rt.cu")
        assert f"'{name}': the CUDA runtime API is host code, which a RawModule source does not hold" in str(info.value)
    with pytest.raises(sim_compiler.SimCompileError) as info:
        llmcupy.RawModule(code=_cudart_source("p[0] = sizeof(cudaLaunchParams);"), target="sim", filename="rt.cu")
    assert re.search(r"^rt\.cu:1:\d+: error: .*cudaLaunchParams", str(info.value), re.M), str(info.value)
    assert ("'cudaLaunchParams': the emulator declares the CUDA runtime's types and enumerators that NVRTC 12.4 to "
            "13.5 all declare") in str(info.value)
    with pytest.raises(sim_compiler.SimCompileError, match=r"'make_cudaExtent': NVRTC declares the CUDA runtime's "
                                                          r"cudaExtent, .* as in cudaExtent e = \{width, height, depth\};"):
        llmcupy.RawModule(code=_cudart_source("cudaExtent e = make_cudaExtent(1, 2, 3); p[0] = e.depth;"), target="sim")
    # a texture object compiles as NVRTC's handle; reading through one is what the emulator refuses
    with pytest.raises(sim_compiler.SimCompileError, match=r"'tex1Dfetch': texture objects are not emulated"):
        llmcupy.RawModule(code="__global__ void k(cudaTextureObject_t t, float* o) { o[0] = tex1Dfetch<float>(t, 0); }",
                          target="sim")


# what a kernel writes of the runtime's enumerators (NVRTC 12.4, 12.9 and 13.5 compile it and give these
# values: test_nvrtc_verdicts_on_the_cuda_runtimes_types)
CUDART_VALUES = r"""
extern "C" __global__ void cudart_values(int* p) {
    cudaError_t e = cudaErrorLaunchFailure;
    p[0] = e; p[1] = cudaErrorIllegalAddress; p[2] = cudaErrorAssert; p[3] = cudaErrorUnknown;
    p[4] = cudaMemcpyDeviceToHost; p[5] = cudaDevAttrMaxSharedMemoryPerBlockOptin; p[6] = CUDA_R_16BF;
    p[7] = cudaAccessPropertyPersisting; p[8] = sizeof(cudaTextureObject_t); p[9] = sizeof(cudaExtent) / sizeof(size_t);
    cudaStream_t s = 0;
    p[10] = s == 0 && e != cudaSuccess;
}
"""


def test_the_emulator_gives_the_cuda_runtimes_enumerators_cudas_values():
    out = np.zeros(11, np.int32)
    llmcupy.RawModule(code=CUDART_VALUES, target="sim").get_function("cudart_values")((1,), (1,), (out,))
    assert out.tolist() == [719, 700, 710, 999, 2, 97, 14, 2, 8, 3, 1]


# ----------------------------------------------------------------------------------------------
# <cuda/std/bit>: libcu++ has <bit>'s functions from C++17 on, the host's <bit> only from C++20

BIT_SOURCE = r"""
#include <cuda/std/bit>
extern "C" __global__ void bits(unsigned* p) {
    p[0] = cuda::std::popcount(0xF0F0u);
    p[1] = cuda::std::countl_zero(1u) + 100 * cuda::std::countl_zero((unsigned char)1);
    p[2] = cuda::std::countr_zero(8u) + 100 * cuda::std::countl_one(0xF0000000u) + 10000 * cuda::std::countr_one(7u);
    p[3] = cuda::std::bit_width(255u) + 100 * cuda::std::has_single_bit(64u) + 1000 * cuda::std::has_single_bit(65u);
    p[4] = cuda::std::bit_floor(100u);
    p[5] = cuda::std::bit_ceil(100u);
    p[6] = cuda::std::rotl(0x80000001u, 1);
    p[7] = cuda::std::rotr(3u, 1);
    p[8] = cuda::std::rotl((unsigned char)0x81, -1);
    p[9] = cuda::std::bit_cast<unsigned>(1.0f);
    p[10] = cuda::std::byteswap(0x11223344u);
    p[11] = cuda::std::countl_zero(0ull) + 100 * cuda::std::popcount(~0ull);
    p[12] = cuda::std::endian::native == cuda::std::endian::little;
    constexpr int width = cuda::std::bit_width(255u);   // constexpr, as in libcu++
    static_assert(width == 8, "");
}
"""
BIT_EXPECTED = [8, 31 + 700, 3 + 400 + 30000, 8 + 100, 64, 128, 3, 0x80000001, 0xC0, 0x3F800000, 0x44332211,
                64 + 6400, 1]


@pytest.mark.parametrize("which", WHICH)
def test_nvrtc_compiles_the_bit_functions(have_nvrtc, which):
    verdicts = nvrtc_verdicts(which, {"bits": BIT_SOURCE, "int": BIT_SOURCE.replace("popcount(0xF0F0u)", "popcount(5)")})
    assert verdicts["bits"][0], verdicts["bits"][1]
    assert not verdicts["int"][0] and "popcount" in verdicts["int"][1]   # unsigned integers only


def test_the_bit_functions_run_in_the_emulator(libcuxx_mode):
    # before: "'popcount' is not a member of 'cuda::std'": the stand-in took the host's <bit>, which declares
    # them only under C++20, while NVRTC compiles them under CuPy's -std=c++17
    p = np.zeros(len(BIT_EXPECTED), np.uint32)
    llmcupy.RawModule(code=BIT_SOURCE, target="sim").get_function("bits")((1,), (1,), (p,))
    assert p.tolist() == BIT_EXPECTED
    # libcu++ takes unsigned integers only: popcount(int) is refused by both (measured with NVRTC 12.4 to 13.5)
    with pytest.raises(sim_compiler.SimCompileError, match="popcount"):
        llmcupy.RawModule(code=BIT_SOURCE.replace("popcount(0xF0F0u)", "popcount(5)"), target="sim")


def test_a_missing_cuda_std_name_is_named_as_written(libcuxx_mode):
    # before: "'no_such_thing' is not a member of 'cuda::__llmcupy_sim_nvrtc_std'", the emulator's own name
    code = '#include <cuda/std/cstdint>\nextern "C" __global__ void k(unsigned* p) { p[0] = cuda::std::no_such_thing(p[1]); }\n'
    with pytest.raises(sim_compiler.SimCompileError) as info:
        llmcupy.RawModule(code=code, target="sim")
    assert "no_such_thing" in str(info.value) and "cuda::std" in str(info.value)
    assert "__llmcupy_sim_nvrtc_std" not in str(info.value)


# ----------------------------------------------------------------------------------------------
# libcu++'s headers beyond the emulator's stand-ins: NVRTC compiles them under CuPy's options (CuPy puts its
# bundled CCCL on -I), and the emulator runs them against the same headers (llmcupy/sim/libcuxx.py)

# (name, its headers, the kernel's body on p = 0, 1, ..., 7, the values it leaves in p) for k(float* p), one
# thread; cuda::atomic_ref's row runs 2 blocks of 32 threads
LIBCUXX_KERNELS = [
    ("optional", "#include <cuda/std/optional>\n",
     "cuda::std::optional<float> none, one = p[1]; p[0] = none.value_or(-1.f) + 10 * *one + 100 * one.has_value();",
     {0: -1 + 10 + 100}),
    ("span", "#include <cuda/std/span>\n",
     "cuda::std::span<float> s(p + 1, 4); float t = 0; for (float x : s.subspan(1, 2)) t += x; "
     "p[0] = t + 10 * s.size() + 100 * s.back();", {0: 2 + 3 + 40 + 400}),
    ("numeric", "#include <cuda/std/numeric>\n",
     "p[0] = cuda::std::accumulate(p + 1, p + 5, 0.f) + 100 * cuda::std::gcd(12, 18) + 1000 * cuda::std::lcm(4, 6);",
     {0: 10 + 600 + 12000}),
    ("variant", "#include <cuda/std/variant>\n",
     "cuda::std::variant<int, float> v = 2.5f; float f = cuda::std::get<float>(v); v = 3; "
     "p[0] = f + 10 * cuda::std::get<int>(v) + 100 * v.index(); "
     "p[1] = cuda::std::visit([](auto x) { return 2.f * x; }, v);", {0: 2.5 + 30, 1: 6}),
    ("ceil_div", "#include <cuda/cmath>\n",
     "p[0] = cuda::ceil_div(7, 2) + 10 * cuda::ceil_div(8u, 4u) + 100 * cuda::round_up(13, 8);",
     {0: 4 + 20 + 1600}),
    ("mdspan", "#include <cuda/std/mdspan>\n",
     "cuda::std::mdspan<float, cuda::std::extents<int, 2, 4>> m(p); "
     "cuda::std::mdspan<float, cuda::std::dextents<int, 2>, cuda::std::layout_left> l(p, 2, 4); "
     "float a = m(1, 2), b = l(1, 2); p[0] = a + 10 * b + 100 * m.extent(1) + 1000 * l.size();",
     {0: 6 + 50 + 400 + 8000}),
    ("numbers", "#include <cuda/std/numbers>\n", "p[0] = cuda::std::numbers::pi_v<float>;", {0: np.float32(np.pi)}),
    ("inplace_vector", "#include <cuda/std/inplace_vector>\n",
     "cuda::std::inplace_vector<int, 4> v; v.push_back(3); v.push_back(4); p[0] = 10 * v.size() + v[1];", {0: 24}),
    ("cub_operators", "#include <cub/block/block_reduce.cuh>\n",
     "p[0] = cuda::maximum<>{}(p[1], p[2]) + 10 * cuda::std::plus<>{}(p[1], p[2]);", {0: 2 + 30}),
    ("atomic_ref", "#include <cuda/atomic>\n",
     "cuda::atomic_ref<float, cuda::thread_scope_device> a(p[0]); a.fetch_add(1.f);", {0: 64}),
    # the device branch, as NVRTC takes (before: the host one, nv/target being read as host code here)
    ("nv_target", "#include <nv/target>\n",
     "NV_IF_TARGET(NV_IS_DEVICE, (p[0] = 1;), (p[0] = 2;)) NV_IF_ELSE_TARGET(NV_PROVIDES_SM_70, (p[1] = 1;), (p[1] = 2;)) "
     "NV_IF_TARGET(NV_IS_HOST, (p[2] = 1;), (p[2] = 2;))", {0: 1, 1: 1, 2: 2}),
]


def _libcuxx_source(name, includes, body):
    return f'{includes}extern "C" __global__ void {name}(float* p) {{ {body} }}\n'


@pytest.mark.parametrize("which", WHICH)
def test_nvrtc_compiles_the_libcuxx_kernels(have_nvrtc, which):
    verdicts = nvrtc_verdicts(which, {name: _libcuxx_source(name, includes, body)
                                      for name, includes, body, _ in LIBCUXX_KERNELS})
    failed = {name: log for name, (ok, log) in verdicts.items() if not ok}
    assert not failed, failed


def test_the_libcuxx_kernels_run_in_the_emulator():
    # before: "fatal error: cuda/std/optional: No such file or directory" (span, numeric, ...), while NVRTC
    # compiles each; now the emulator compiles them against CuPy's libcu++, as the GPU path does
    pytest.importorskip("llmcupy.sim.libcuxx").libcudacxx_dir() or pytest.skip("no real libcu++ here (CuPy's)")
    code = "".join(dict.fromkeys(includes for _, includes, _, _ in LIBCUXX_KERNELS)) + "".join(
        _libcuxx_source(name, "", body) for name, _, body, _ in LIBCUXX_KERNELS)
    mod = llmcupy.RawModule(code=code, target="sim")
    for name, _, _, expected in LIBCUXX_KERNELS:
        p = np.zeros(8, np.float32) if name == "atomic_ref" else np.arange(8, dtype=np.float32)
        grid, block = ((2,), (32,)) if name == "atomic_ref" else ((1,), (1,))
        mod.get_function(name)(grid, block, (p,))
        assert {i: p[i] for i in expected} == pytest.approx(expected), name


def test_without_the_real_libcuxx_its_headers_are_refused_naming_what_to_install(monkeypatch):
    monkeypatch.setenv("LLMCUPY_SIM_LIBCUDACXX", "none")
    for name, includes, body, _ in LIBCUXX_KERNELS:
        if "cub/" in includes:
            continue   # the emulator's CUB runs it with the stand-ins too (test_cubs_operators_are_cccl_3s)
        with pytest.raises(sim_compiler.SimCompileError) as info:
            llmcupy.RawModule(code=_libcuxx_source(name, includes, body), target="sim")
        header = re.search(r"<(.*)>", includes)[1]
        assert (f"'{header}': LLMCUPY_SIM_LIBCUDACXX=none chose the emulator's stand-ins, which hold only "
                "cuda/std/array, atomic, ") in str(info.value), name
        assert "install CuPy (pip install cupy-cuda12x, or llmcupy's [cuda12] extra)" in str(info.value), name


# libcu++ has no long double under a CUDA compiler (NVRTC): numeric_limits<long double> is the unspecialised
# template, without members. Before, the emulator read libcu++ as host code, with long double: these ran here.
LONG_DOUBLE_LIMITS = {name: "#include <cuda/std/limits>\n"
                      f'extern "C" __global__ void k(float* p) {{ p[0] = cuda::std::numeric_limits<long double>::{name}; }}\n'
                      for name in ("max()", "is_specialized", "digits")}


@pytest.mark.parametrize("which", WHICH)
def test_nvrtcs_libcuxx_has_no_long_double_limits(have_nvrtc, which):
    verdicts = nvrtc_verdicts(which, LONG_DOUBLE_LIMITS)
    assert not any(ok for ok, _ in verdicts.values()) and all("has no member" in log for _, log in verdicts.values())


def test_the_emulators_libcuxx_has_no_long_double_limits_either():
    pytest.importorskip("llmcupy.sim.libcuxx").libcudacxx_dir() or pytest.skip("no real libcu++ here (CuPy's)")
    for name, code in LONG_DOUBLE_LIMITS.items():
        with pytest.raises(sim_compiler.SimCompileError) as info:
            llmcupy.RawModule(code=code, target="sim")
        # g++: "'max' is not a member of 'cuda::std::__4::numeric_limits<long double>'"; clang: "no member named"
        assert re.search(rf"{name.rstrip('()')}.{{1,3}}(is not a member of|in) .{{1,3}}cuda::std::.*numeric_limits<long "
                         "double>", str(info.value)), str(info.value)


# CCCL 3 (CuPy 14's, which NVRTC compiles a kernel against) removed CUB's functors for libcu++'s
CUB_FUNCTORS = {f"cub_{name.lower()}": "#include <cub/block/block_reduce.cuh>\n"
                f'extern "C" __global__ void k(float* p) {{ p[0] = cub::{name}()(p[1], p[2]); }}\n'
                for name in ("Sum", "Max", "Min")}


@pytest.mark.parametrize("which", WHICH)
def test_nvrtc_has_no_cub_sum_max_or_min(have_nvrtc, which):
    verdicts = nvrtc_verdicts(which, CUB_FUNCTORS)
    assert {name: ok for name, (ok, _) in verdicts.items()} == dict.fromkeys(CUB_FUNCTORS, False)
    assert all("has no member" in log for _, log in verdicts.values()), verdicts


def test_cubs_operators_are_cccl_3s(libcuxx_mode):
    # before: the emulator's CUB had cub::Sum, Max and Min, so a kernel using them ran here and failed to
    # compile on a GPU; and with the stand-ins it lacked cuda::maximum, which NVRTC's CUB brings in
    for name, code in CUB_FUNCTORS.items():
        with pytest.raises(sim_compiler.SimCompileError, match=r"has no cub::Sum, cub::Max or cub::Min .*"
                           r"pass cuda::std::plus<>\{\}, cuda::maximum<>\{\} or cuda::minimum<>\{\}"):
            llmcupy.RawModule(code=code, target="sim")
    name, includes, body, expected = next(k for k in LIBCUXX_KERNELS if k[0] == "cub_operators")
    body += " p[3] = cuda::minimum<>{}(p[1], p[2]); p[4] = cuda::maximum<float>{}(p[5], p[6]);"
    p = np.arange(8, dtype=np.float32)
    llmcupy.RawModule(code=_libcuxx_source(name, includes, body), target="sim").get_function(name)((1,), (1,), (p,))
    assert p[[0, 3, 4]].tolist() == [expected[0], 1, 6]


# ----------------------------------------------------------------------------------------------
# the version macros NVRTC predefines, which a kernel's #if reads: each NVRTC (12.4, 12.9, 13.5) defines all
# of them, consistent with one another and with -arch; the emulator too, for the CUDA 12.0 it presents
# (__CUDACC_VER_MAJOR__ 12, __CUDACC_VER_MINOR__ 0). Before, CUDART_VERSION and the others were undefined
# here, so `#if CUDART_VERSION >= 11000` took the old branch in the emulator and the new one on a GPU.
VERSION_MACROS = r"""
#if !defined(CUDART_VERSION) || !defined(__CUDART_API_VERSION) || !defined(__CUDACC_VER_BUILD__) \
    || !defined(__CUDA_ARCH_LIST__) || !defined(__NVCC_DIAG_PRAGMA_SUPPORT__)
#error "a version macro is undefined"
#endif
static_assert(CUDART_VERSION == __CUDACC_VER_MAJOR__ * 1000 + __CUDACC_VER_MINOR__ * 10, "CUDART_VERSION");
static_assert(__CUDART_API_VERSION == CUDART_VERSION, "__CUDART_API_VERSION");
static_assert(__CUDA_ARCH_LIST__ == __CUDA_ARCH__, "__CUDA_ARCH_LIST__");
static_assert(__CUDACC_VER_BUILD__ > 0, "__CUDACC_VER_BUILD__");
extern "C" __global__ void branch(int* p) {
#if CUDART_VERSION >= 11000
    p[0] = 1;
#else
    p[0] = 2;
#endif
}
"""


@pytest.mark.parametrize("which", WHICH)
def test_nvrtc_defines_the_version_macros_consistently(have_nvrtc, which):
    assert nvrtc_verdicts(which, {"versions": VERSION_MACROS}) == {"versions": (True, "")}


@pytest.mark.parametrize("arch", [None, "sm_90"])
def test_the_emulator_defines_nvrtcs_version_macros(libcuxx_mode, arch):
    # a libcu++ header in front reads them as a host compile without a CUDA toolkit does (hidden while it is
    # read), and leaves them defined for the kernel after it
    options = ("-arch=" + arch,) if arch else ()
    for head in ("", "#include <cuda/std/cmath>\n"):
        p = np.zeros(1, np.int32)
        module = llmcupy.RawModule(code=head + VERSION_MACROS, target="sim", options=options)
        module.get_function("branch")((1,), (1,), (p,))
        assert p[0] == 1, head


# ----------------------------------------------------------------------------------------------
# predefined macros: the host compiler's (__GNUC__, __x86_64__, ...) are not NVRTC's (__EDG__, __cpp_exceptions)

def _host_only_macros() -> list[str]:
    """The host compiler's predefined macros (under the emulator's language options) that NVRTC does not define,
    less the limits and formats of types (sim_compiler.VALUE_MACROS: FLT_MAX is __FLT_MAX__, ...)."""
    cxx = os.environ.get("CXX", "g++")
    host = sim_compiler._macro_definitions([cxx, "-std=c++17", "-O2", "-fPIC", "-pthread", "-fno-exceptions",
                                            "-fno-rtti", "-fsigned-char"], os.devnull)
    nvrtc_has = {**sim_compiler.NVRTC_PREDEFINED_MACROS, **sim_compiler.NVRTC_CXX17_MACROS}
    return sorted(name for name in host if not sim_compiler.VALUE_MACROS.fullmatch(name) and name not in nvrtc_has)


def _host_macros_absent(but=()) -> str:
    return "".join(f"#ifdef {name}\n#error \"{name} is defined\"\n#endif\n" for name in _host_only_macros()
                   if name not in but) + KERNEL


def _nvrtc_macros_present(edg_version: str = ">= 603") -> str:
    # NVRTC 12.0 has __EDG_VERSION__ 603 (the emulator's); 12.4, 12.9 and 13.5 605, 606 and 608
    checks = [f"#if !defined({name}) || !({name} {'== ' + value if name != '__EDG_VERSION__' else edg_version})\n"
              f"#error \"{name} is not {value}\"\n#endif\n"
              for name, value in {**sim_compiler.NVRTC_PREDEFINED_MACROS, **sim_compiler.NVRTC_CXX17_MACROS}.items()]
    return "".join(checks) + KERNEL


def test_the_host_lists_hundreds_of_macros_nvrtc_lacks():
    # the premise of the tests below: the host compiler's list is read (g++ 12 on x86-64: 146 of them)
    names = _host_only_macros()
    assert len(names) > 100 and "__SIZEOF_INT128__" in names, names
    assert re.search(r"^__(GNUC|clang)__$", "\n".join(names), re.M), names


@pytest.mark.parametrize("which", WHICH)
def test_nvrtc_has_none_of_the_host_compilers_macros_and_its_own(have_nvrtc, which):
    # 13.5 adds C++14's __cpp_digit_separators; the emulator presents 12.0, which lacks it, as 12.4 and 12.9 do
    but = ("__cpp_digit_separators",) if which == "cuda13" else ()
    verdicts = nvrtc_verdicts(which, {"absent": _host_macros_absent(but), "present": _nvrtc_macros_present()})
    assert verdicts["absent"][0], verdicts["absent"][1][-3000:]
    assert verdicts["present"][0], verdicts["present"][1][-3000:]


# a kernel's #if on them, before and after the emulator's headers (which read the system's headers with the host's
# macros back on), and the macros of those headers that expand to a host macro
PREDEFINED_BRANCHES = r"""
#if defined(__GNUC__) || defined(__x86_64__) || defined(__aarch64__) || defined(__SIZEOF_INT128__) \
    || defined(__OPTIMIZE__) || defined(__linux__) || defined(__clang__) || defined(__BYTE_ORDER__)
#define HOST 1
#else
#define HOST 0
#endif
#include <cuda/std/cfloat>
#include <cuda/std/climits>
#include <cooperative_groups.h>
#include <cuda/std/cmath>
#if defined(__GNUC__) || defined(__x86_64__) || defined(__SIZEOF_INT128__)
#define HOST_AFTER 1
#else
#define HOST_AFTER 0
#endif
extern "C" __global__ void branches(float* p, int* q) {
#if __cpp_exceptions && __EDG__
    q[0] = HOST + 2 * HOST_AFTER;
#else
    q[0] = 8;
#endif
    q[1] = INT_MAX; q[2] = CHAR_BIT; p[0] = FLT_MAX; p[1] = DBL_EPSILON;
}
#ifndef __GNUC__
extern "C" __global__ void only_without_gnuc(int* q) { q[0] = 1; }
#endif
"""


def test_a_kernel_sees_nvrtcs_predefined_macros_not_the_hosts(libcuxx_mode):
    assert sim_compiler.compiled_kernel_names(PREDEFINED_BRANCHES) == ["branches", "only_without_gnuc"]
    for source in (_host_macros_absent(), _nvrtc_macros_present("== 603")):
        llmcupy.RawModule(code=source, target="sim")
    module = llmcupy.RawModule(code=PREDEFINED_BRANCHES, target="sim")
    p, q = np.zeros(2, np.float32), np.zeros(3, np.int32)
    module.get_function("branches")((1,), (1,), (p, q))
    assert q.tolist() == [0, 2**31 - 1, 8]
    assert p.tolist() == [np.finfo(np.float32).max, np.finfo(np.float64).eps]
    module.get_function("only_without_gnuc")((1,), (1,), (q,))
    assert q[0] == 1


def test_a_predefined_macro_the_options_set_is_the_options(libcuxx_mode):
    # -D and -U win, as under NVRTC: a kernel's own choice is not undone
    source = "#if __GNUC__ != 3 || defined(__EDG__)\n#error \"the options' macros\"\n#endif\n" + KERNEL
    llmcupy.RawModule(code=source, target="sim", options=("-D__GNUC__=3", "-U__EDG__"))


# ----------------------------------------------------------------------------------------------
# GCC's builtins and GNU extensions: g++ takes them in any C++, NVRTC few of them

# the math functions with __builtin_ before them (GCC has one for each; NVRTC none)
MATH_BUILTINS = """acos acosh asin asinh atan atan2 atanh cbrt ceil cos cosh erf erfc exp exp10 exp2 expm1 fabs fdim
    floor fma fmax fmin fmod hypot ldexp lgamma log log10 log1p log2 logb nearbyint nextafter pow remainder rint
    round sin sinh sqrt tan tanh tgamma trunc""".split()
_MATH_BUILTIN_ARGS = {"ldexp": "p[1], 2", "fma": "p[1], p[2], p[3]",
                      **dict.fromkeys("atan2 fdim fmax fmin fmod hypot nextafter pow remainder".split(), "p[1], p[2]")}
# (name, what precedes the kernel, the kernel's body, NVRTC compiles it: True, False, "newer" (12.9 and 13.5 do;
# the emulator takes it) or "13.5" (13.5 alone does; the emulator refuses it, as 12.4 and 12.9 do))
BUILTINS = [
    ("expect", "", "if (__builtin_expect(q[0] > 0, 1)) p[0] = 1;", True),
    ("assume", "", "__builtin_assume(q[0] > 0); p[0] = q[0];", True),
    ("assume_aligned", "", "float* a = (float*)__builtin_assume_aligned(p, 16); a[0] = 1;", True),
    ("unreachable", "", "if (q[0] < 0) __builtin_unreachable(); p[0] = 1;", True),
    ("bit_cast", "", "q[0] = __builtin_bit_cast(int, p[0]);", True),
    ("addressof", "", "int* a = __builtin_addressof(q[1]); a[0] = 1;", True),
    ("is_constant_evaluated", "", "q[0] = __builtin_is_constant_evaluated();", True),
    ("isnan_isinf_isfinite", "", "q[0] = __builtin_isnan(p[0]) + 2 * __builtin_isinf(p[1]) + 4 * __builtin_isfinite(p[2]);",
     True),
    ("copysign", "", "p[0] = __builtin_copysignf(p[1], p[2]) + (float)__builtin_copysign(1.0, -1.0);", True),
    ("file_line_function", "", "q[0] = __builtin_LINE() + __builtin_FILE()[0] + __builtin_FUNCTION()[0];", "newer"),
    ("gnu_spellings", "__device__ void copies(float* __restrict a, const float* __restrict__ b) { a[0] = b[0]; } ",
     "copies(p, p + 1); q[0] = __alignof__(double) + 0b1010 + __func__[0] + __PRETTY_FUNCTION__[0]; "
     "__attribute__((unused)) int t = 1;", True),
    ("trap", "", "if (q[0] < 0) __builtin_trap(); p[0] = 1;", False),
    *[(name, "", f"q[0] = __builtin_{name}(q[1]);", False) for name in ("popcount", "clz", "ctz", "ffs", "parity",
                                                                        "bswap16", "bswap32", "abs")],
    *[(name, "", f"q[0] = __builtin_{name}(u[1]);", False) for name in ("popcountl", "popcountll", "clzll", "ctzll",
                                                                        "ffsll", "bswap64")],
    ("memcpy", "", "__builtin_memcpy(p, p + 1, 4);", False),
    ("memset", "", "__builtin_memset(p, 0, 4);", False),
    ("memcmp", "", "q[0] = __builtin_memcmp(p, p + 1, 4);", False),
    ("strlen", "", 'q[0] = __builtin_strlen("ab");', False),
    ("offsetof", "struct WithB { int a; float b; }; ", "q[0] = __builtin_offsetof(WithB, b);", "13.5"),
    ("launder", "", "int* a = __builtin_launder(q); a[0] = 1;", False),
    ("constant_p", "", "q[0] = __builtin_constant_p(q[1]);", "13.5"),
    ("add_overflow", "", "int r; q[0] = __builtin_add_overflow(q[1], q[2], &r); q[3] = r;", "13.5"),
    ("sub_overflow", "", "int r; q[0] = __builtin_sub_overflow(q[1], q[2], &r); q[3] = r;", "13.5"),
    ("mul_overflow", "", "int r; q[0] = __builtin_mul_overflow(q[1], q[2], &r); q[3] = r;", "13.5"),
    *[(name, "", f"p[0] = __builtin_{name}();", False) for name in ("huge_valf", "huge_val", "inff", "inf")],
    *[(name, "", f'p[0] = __builtin_{name}("");', False) for name in ("nanf", "nan")],
    ("signbit", "", "q[0] = __builtin_signbit(p[0]);", False),
    ("isnormal", "", "q[0] = __builtin_isnormal(p[0]);", False),
    ("fpclassify", "", "q[0] = __builtin_fpclassify(0, 1, 2, 3, 4, p[0]);", False),
    ("isless", "", "q[0] = __builtin_isless(p[0], p[1]) + __builtin_isunordered(p[0], p[1]);", False),
    *[(f"{name}{suffix}", "", f"p[0] = __builtin_{name}{suffix}({_MATH_BUILTIN_ARGS.get(name, 'p[1]')});", False)
      for name in MATH_BUILTINS for suffix in ("", "f")],
    ("prefetch", "", "__builtin_prefetch(p); p[0] = 1;", False),
    ("alloca", "", "int* a = (int*)__builtin_alloca(8); a[0] = 1; q[0] = a[0];", False),
    ("frame_address", "", "u[0] = (unsigned long long)__builtin_frame_address(0);", False),
    ("return_address", "", "u[0] = (unsigned long long)__builtin_return_address(0);", False),
    ("vector_size", "typedef float f4v __attribute__((vector_size(16))); ", "f4v a = {1, 2, 3, 4}; p[0] = a[1];", False),
    ("shuffle", "typedef int i4v __attribute__((vector_size(16))); ",
     "i4v a = {1, 2, 3, 4}, m = {3, 2, 1, 0}; i4v r = __builtin_shuffle(a, m); q[0] = r[0];", False),
    ("va_start", "__device__ int first(int n, ...) { __builtin_va_list ap; __builtin_va_start(ap, n); "
                 "int s = __builtin_va_arg(ap, int); __builtin_va_end(ap); return s; } ", "q[0] = first(1, 2);", False),
    ("sync_fetch_and_add", "", "q[0] = __sync_fetch_and_add(q + 1, 1);", False),
    ("sync_synchronize", "", "__sync_synchronize(); q[0] = 1;", False),
    ("atomic_fetch_add", "", "q[0] = __atomic_fetch_add(q + 1, 1, 0);", False),
    ("atomic_load_n", "", "q[0] = __atomic_load_n(q + 1, 0);", False),
    ("atomic_store_n", "", "__atomic_store_n(q + 1, 1, 0);", False),
    ("memory_order", "", "q[0] = __ATOMIC_RELAXED;", False),
    ("typeof", "", "__typeof__(q[0]) t = 1; q[0] = t;", False),
    ("extension", "", "__extension__ long long x = 1; q[0] = x;", False),
    ("local_label", "", "{ __label__ out; if (q[0]) goto out; q[1] = 1; out: ; }", False),
    ("complex", "", "_Complex float c; __real__ c = 1; __imag__ c = 2; p[0] = __imag__ c;", False),
    ("float128", "", "__float128 x = p[0]; p[1] = (float)x;", False),
]
# GNU syntax g++ warns of only (-Wpedantic, -Wc++20-extensions): refused after the build, each line named
GNU_SYNTAX = [
    ("statement_expression", "", "q[0] = ({ int t = q[1]; t * 2; });", "a statement expression"),
    ("case_range", "", "switch (q[0]) { case 1 ... 3: q[1] = 1; break; default: q[1] = 0; }", "a case range"),
    ("computed_goto", "", "void* t = &&done; goto *t; done: q[0] = 1;", "a computed goto"),
    ("omitted_middle", "", "q[0] = q[1] ?: q[2];", "a conditional with its middle operand omitted"),
    ("zero_length_array", "struct Zero { int n; int data[0]; }; ", "q[0] = sizeof(Zero);", "an array of size zero"),
    ("flexible_array", "struct Flexible { int n; int data[]; }; ", "q[0] = sizeof(Flexible);",
     "a flexible array member"),
    ("designated_initializer", "struct Point { int x, y; }; ", "Point d = {.x = 1, .y = 2}; q[0] = d.x + d.y;",
     "a designated initializer"),
]


def _builtin_source(prelude: str, body: str, kernel: str = "k") -> str:
    return (f'{prelude}extern "C" __global__ void {kernel}(float* p, int* q, unsigned long long* u) '
            f"{{ {body} }}\n")


@pytest.mark.parametrize("which", WHICH)
def test_nvrtc_verdicts_on_gcc_builtins_and_gnu_extensions(have_nvrtc, which):
    rows = [*BUILTINS, *[(name, prelude, body, False) for name, prelude, body, _ in GNU_SYNTAX]]
    verdicts = nvrtc_verdicts(which, {name: _builtin_source(prelude, body) for name, prelude, body, _ in rows})
    wrong = {name: verdicts[name][1] for name, _, _, compiles in rows
             if verdicts[name][0] != {"newer": which != "oldest", "13.5": which == "cuda13"}.get(compiles, compiles)}
    assert not wrong, wrong


def test_nvrtc_takes_designated_initializers_from_cpp20_on(have_nvrtc):
    _, prelude, body, _ = next(row for row in GNU_SYNTAX if row[0] == "designated_initializer")
    res = nvrtc.compile_source(_builtin_source(prelude, body), 80, filename="probe.cu",
                               options=nvrtc.module_options(80, ("-std=c++20",)), name_expressions=[])
    assert res.ok, res.log


def test_the_emulator_refuses_the_gcc_builtins_nvrtc_lacks_naming_the_line_and_what_to_write():
    # before: each compiled and ran here (g++ has them all), and NVRTC refused it on a GPU
    refused = [row for row in BUILTINS if row[3] in (False, "13.5")]
    code = "".join(_builtin_source(prelude, body, f"k{i}") for i, (_, prelude, body, _) in enumerate(refused))
    with pytest.raises(sim_compiler.SimCompileError) as info:
        llmcupy.RawModule(code=code, target="sim", filename="gnu.cu")
    text = str(info.value)
    for line, (name, _, _, _) in enumerate(refused, 1):
        assert re.search(rf"^gnu\.cu:{line}:\d+: error: .*(?:is GCC's, which NVRTC does not have|is not available in "
                         "device code)", text, re.M), (name, text)
    assert ("__builtin_popcount is GCC's, which NVRTC does not have (NVRTC refuses it: 'identifier "
            "\"__builtin_popcount\" is undefined'); write __popc(x), or __popcll(x) for 64 bits") in text
    assert "__builtin_inff is GCC's" in text and "write CUDART_INF_F from <math_constants.h>" in text
    assert "__builtin_sqrtf is GCC's" in text and "the math functions are built in: drop __builtin_" in text
    assert "__attribute__((vector_size)) is not available in device code" in text
    assert "__float128 is not available in device code (NVRTC refuses it too" in text


def test_the_emulator_refuses_gnu_syntax_naming_each_line():
    # before: g++ compiled each (with no warning but for the designated initializer), and NVRTC refused it
    code = "".join(_builtin_source(prelude, body, f"k{i}") for i, (_, prelude, body, _) in enumerate(GNU_SYNTAX))
    with pytest.raises(sim_compiler.SimCompileError) as info:
        llmcupy.RawModule(code=code, target="sim", filename="syntax.cu")
    text = str(info.value)
    for line, (name, _, _, what) in enumerate(GNU_SYNTAX, 1):
        assert re.search(rf"^syntax\.cu:{line}:\d+: error: {what}\b.* is a GNU extension, which NVRTC refuses",
                         text, re.M), (name, text)
    assert len(re.findall("^syntax.cu:", text, re.M)) == len(GNU_SYNTAX), text   # one refusal per place
    assert "call a lambda in place" in text
    # under C++20, as NVRTC does, the designated initializer compiles
    _, prelude, body, _ = GNU_SYNTAX[-1]
    llmcupy.RawModule(code=_builtin_source(prelude, body), options=("-std=c++20",), target="sim").get_function("k")


def test_gnu_syntax_in_the_kernels_own_header_is_refused(tmp_path):
    (tmp_path / "mine.cuh").write_text("__device__ int twice(int x) { return ({ int t = x; 2 * t; }); }\n")
    with pytest.raises(sim_compiler.SimCompileError, match=r"mine\.cuh:1:\d+: error: a statement expression"):
        llmcupy.RawModule(code='#include "mine.cuh"\n' + _builtin_source("", "q[0] = twice(q[1]);"),
                          options=(f"-I{tmp_path}",), target="sim")


def test_the_emulator_takes_and_computes_the_builtins_nvrtc_takes():
    accepted = [row for row in BUILTINS if row[3] in (True, "newer")]
    code = "".join(_builtin_source(prelude, body, f"b_{name}") for name, prelude, body, _ in accepted)
    mod = llmcupy.RawModule(code=code, target="sim")
    p = np.array([np.nan, -np.inf, 2.0, -1.0], np.float32)
    q = np.zeros(4, np.int32)
    u = np.zeros(2, np.uint64)
    mod.get_function("b_isnan_isinf_isfinite")((1,), (1,), (p, q, u))
    assert q[0] == 1 + 2 + 4
    p[:] = [0, 3, -1, 0]
    mod.get_function("b_copysign")((1,), (1,), (p, q, u))
    assert p[0] == -3 - 1
    p[0] = 1.0
    mod.get_function("b_bit_cast")((1,), (1,), (p, q, u))
    assert q[0] == 0x3F800000
    # __builtin_expect keeps its value; __builtin_unreachable on a path never taken
    q[0] = 1
    mod.get_function("b_expect")((1,), (1,), (p, q, u))
    assert p[0] == 1
    # --device-float128, as NVRTC (for sm_100 and newer), lets __float128 through
    float128 = next(row for row in BUILTINS if row[0] == "float128")
    llmcupy.RawModule(code=_builtin_source(float128[1], float128[2]), options=("--device-float128",), target="sim")


# What the refusals advise, in one kernel: it compiles under every NVRTC and in the emulator, and computes there
# what the builtins it replaces compute
BUILTINS_ADVISED = r"""
#include <cuda/std/cmath>
#include <cuda/std/cstring>
#include <cuda/std/cstddef>
#include <math_constants.h>
struct WithB { int a; float b; };
extern "C" __global__ void advised(float* p, int* q, unsigned long long* u) {
    unsigned x = (unsigned)q[0];
    q[1] = __popc(x) + (__popcll(u[0]) << 8);
    q[2] = __clz(x) + (__clzll(u[0]) << 8);
    q[3] = (__ffs(x) - 1) + ((__ffsll(u[0]) - 1) << 8);
    q[4] = __popc(x) & 1;
    q[5] = (int)__byte_perm(x, 0, 0x0123);
    q[6] = (int)__byte_perm(x, 0, 0x4401);
    q[7] = (int)offsetof(WithB, b) + (int)cuda::std::strlen("ab") + abs(-1);
    p[0] = CUDART_INF_F;
    p[1] = INFINITY;
    p[2] = CUDART_NAN_F + NAN;
    p[3] = signbit(p[4]) + sqrtf(4.0f) + fabsf(-1.0f);
    memcpy(p + 5, p + 3, sizeof(float));
    if (q[0] < 0) __trap();
    __threadfence();
    atomicAdd(q + 8, 1);
    int one = 1;
    decltype(one) t = one;
    q[9] = t;
}
"""


@pytest.mark.parametrize("which", WHICH)
def test_what_the_builtin_refusals_advise_compiles_under_nvrtc(have_nvrtc, which):
    ok, log = nvrtc_verdicts(which, {"advised": BUILTINS_ADVISED})["advised"]
    assert ok, log


def test_what_the_builtin_refusals_advise_computes_as_the_builtins(libcuxx_mode):
    mod = llmcupy.RawModule(code=BUILTINS_ADVISED, target="sim")
    x = 0x00F0_1234
    p = np.zeros(6, np.float32)
    p[4] = -2.0
    q = np.zeros(10, np.int32)
    q[0] = x
    u = np.array([0x0000_0100_0000_0000], np.uint64)
    mod.get_function("advised")((1,), (1,), (p, q, u))
    assert q[1] == bin(x).count("1") + (1 << 8)
    assert q[2] == 8 + (23 << 8)
    assert q[3] == 2 + (40 << 8)
    assert q[4] == bin(x).count("1") & 1
    assert q[5] == int.from_bytes(x.to_bytes(4, "little"), "big")
    assert q[6] == 0x3412
    assert q[7] == 4 + 2 + 1
    assert np.isinf(p[0]) and np.isinf(p[1]) and np.isnan(p[2])
    assert p[3] == 1 + 2 + 1 and p[5] == p[3]
    assert q[8] == 1 and q[9] == 1
