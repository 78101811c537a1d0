"""Compile check without a GPU: every kernels_cu/*.cu through NVRTC for sm_75, sm_80 and sm_90.

The emulator builds the kernels with g++, which accepts code NVRTC rejects; this compiles the same
files the way ``llmcupy.RawModule`` does on a GPU, down to SASS. NVRTC and the CUDA headers come
from pip wheels (``pip install -e .[test]``), so no GPU or toolkit is needed. Without them the
tests skip, except on CI (``CI`` or ``LLMCUPY_REQUIRE_NVRTC`` set), where they fail instead.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llmcupy import nvrtc
from llmcupy.runtime.module import kernels_dir
from llmcupy.sim.compiler import global_kernel_names

ARCHS = nvrtc.DEFAULT_ARCHS
FILES = sorted(p.name for p in kernels_dir().glob("*.cu"))


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: f"sm_{a}")
@pytest.mark.parametrize("filename", FILES)
def test_kernel_file_compiles(have_nvrtc, filename, arch):
    res = nvrtc.compile_file(kernels_dir() / filename, arch)
    assert res.ok, f"kernels_cu/{filename} does not compile with NVRTC for sm_{arch}:\n{res.log}"
    # Every kernel the runtime can launch is in the cubin, under the name the ops use.
    expected = set(global_kernel_names((kernels_dir() / filename).read_text()))
    compiled = {k.kernel for k in res.kernels}
    assert expected <= compiled, f"missing from the cubin: {sorted(expected - compiled)}"
    for k in res.kernels:
        assert k.registers is not None and k.registers > 0, k


# ----------------------------------------------------------------------------------------------
# the oldest NVRTC and headers we claim (the test extra's floor), as well as the newest above

ROOT = Path(__file__).resolve().parents[1]


def _floor_in_pyproject() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    m = re.search(r'"nvidia-cuda-nvrtc-cu12>=([0-9.]+)"', text)
    assert m, "the test extra must pin a floor for nvidia-cuda-nvrtc-cu12"
    return m.group(1)


def test_ci_checks_the_floor_of_the_test_extra():
    # the version CI downloads for the oldest-headers check is the one pyproject.toml claims
    m = re.search(r"^OLDEST_CUDA=([0-9.]+)$", (ROOT / ".ci" / "run").read_text(), re.M)
    assert m, ".ci/run must set OLDEST_CUDA"
    floor = _floor_in_pyproject()
    assert m.group(1).split(".")[:2] == floor.split(".")[:2], (m.group(1), floor)
    assert f'"nvidia-cuda-runtime-cu12>={floor}"' in (ROOT / "pyproject.toml").read_text()


# (environment variable, the wheels' layout: library and include folder, the NVRTC version expected)
OTHER_CUDAS = {
    "oldest": ("LLMCUPY_OLDEST_CUDA", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12", "nvidia/cuda_runtime/include", None),
    "cuda13": ("LLMCUPY_CUDA13", "nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cu13/include", "13."),
}


@pytest.mark.parametrize("which", sorted(OTHER_CUDAS))
def test_kernel_files_compile_with_other_supported_nvrtcs(which):
    """Every kernel file with the oldest NVRTC and headers the test extra allows, and with CUDA 13's:
    a folder holding their wheels unpacked (``.ci/run`` makes them). Skipped without it, except on CI.

    In a child process: a second libnvrtc cannot be loaded next to the one the other tests use. One
    architecture is enough: what differs between CUDA versions here is the headers, not codegen."""
    var, lib_rel, include_rel, expected = OTHER_CUDAS[which]
    root = os.environ.get(var)
    if not root:
        if os.environ.get("CI") or os.environ.get("LLMCUPY_REQUIRE_NVRTC"):
            pytest.fail(f"CI must compile against the {which} NVRTC too: set {var} (.ci/run does)")
        pytest.skip(f"{var} is not set (.ci/run unpacks that NVRTC and its headers there)")
    lib, include = Path(root) / lib_rel, Path(root) / include_rel
    assert lib.is_file() and (include / "cooperative_groups.h").is_file(), f"incomplete {root}"
    env = dict(os.environ, LLMCUPY_NVRTC=str(lib), LLMCUPY_CUDA_INCLUDE=str(include), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "llmcupy.nvrtc", "-v", "--arch", "80"], env=env,
                          capture_output=True, text=True, timeout=600)
    version = expected or ".".join(_floor_in_pyproject().split(".")[:2]) + " "
    assert f"NVRTC {version}" in proc.stdout and str(lib) in proc.stdout, proc.stdout[:2000] + proc.stderr
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


# ----------------------------------------------------------------------------------------------
# fast-math codegen that moves results past their tolerance

TANH_FILES = sorted(f for f in FILES if "tanh" in (kernels_dir() / f).read_text())


def test_fast_math_turns_tanhf_into_the_coarse_instruction(have_nvrtc, tmp_path):
    # the premise of the test below: NVRTC 12.8+ with --use_fast_math (our default options) emits
    # tanh.approx.f32, relative error up to 2^-11 per the PTX ISA, for a plain tanhf
    if nvrtc.find_nvrtc().version() < (12, 8):
        pytest.skip("NVRTC before 12.8 keeps the accurate tanhf under --use_fast_math")
    src = tmp_path / "plain_tanhf.cu"
    src.write_text('extern "C" __global__ void k(float* y) { y[threadIdx.x] = tanhf(y[threadIdx.x]); }\n')
    assert "tanh.approx.f32" in nvrtc.file_ptx(src, 80)


@pytest.mark.parametrize("filename", TANH_FILES)
def test_gelu_kernels_do_not_use_the_coarse_tanh_instruction(have_nvrtc, filename):
    # GELU computes tanh from the exponential (common.cuh, tanh_from_exp): with tanh.approx.f32 it
    # could be 1.7e-4 from its reference at x = 1, against a tolerance of 1e-5, and would change with
    # the CUDA version (NVRTC 12.6 and earlier keep the accurate tanhf)
    ptx = nvrtc.file_ptx(kernels_dir() / filename, 80)
    assert "tanh.approx" not in ptx, f"kernels_cu/{filename} compiles to tanh.approx under our options"


# ----------------------------------------------------------------------------------------------
# the ptxas log parser

CANNED_LOG = """\
ptxas info    : 6144 bytes gmem
ptxas info    : Function properties for helper_noinline
ptxas         .     8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z13second_kernelPfi' for 'sm_90'
ptxas info    : Function properties for _Z13second_kernelPfi
ptxas         .     40 bytes stack frame, 36 bytes spill stores, 28 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 2048 bytes smem, 368 bytes cmem[0]
ptxas info    : Compile time = 3.1 ms
ptxas info    : Compiling entry function '_ZN2ns5innerEv' for 'sm_90'
ptxas info    : Function properties for _ZN2ns5innerEv
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, 352 bytes cmem[0]
ptxas info    : Compiling entry function '_Z11first_tiledILi64EEvPKf' for 'sm_90'
ptxas info    : Function properties for _Z11first_tiledILi64EEvPKf
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 256 bytes smem, 360 bytes cmem[0]
"""


def test_parse_canned_log():
    ks = nvrtc.parse_ptxas_log(CANNED_LOG, {"_Z13second_kernelPfi": "second_kernel"})
    # source order: ptxas lists entries last-defined first
    assert [k.kernel for k in ks] == ["first_tiled<...>", "ns::inner", "second_kernel"]
    tiled, inner, second = ks
    assert (second.registers, second.spill_stores, second.spill_loads, second.shared_bytes, second.stack_bytes,
            second.barriers) == (255, 36, 28, 2048, 40, 1)
    assert (inner.registers, inner.shared_bytes, inner.spill_stores, inner.barriers) == (8, 0, 0, None)
    assert (tiled.registers, tiled.shared_bytes, tiled.mangled) == (32, 256, "_Z11first_tiledILi64EEvPKf")


@pytest.mark.parametrize("mangled, name", [
    ("_Z23softmax_forward_kernel1PfPKfii", "softmax_forward_kernel1"),
    ("_Z30softmax_forward_online_kernel6PfPKfii", "softmax_forward_online_kernel6"),
    ("_ZN2ns5innerEv", "ns::inner"),
    ("_Z6kernelILi128EEvPf", "kernel<...>"),
    ("plain_c_kernel", "plain_c_kernel"),
])
def test_demangle(mangled, name):
    assert nvrtc.demangle(mangled) == name


REAL_SOURCE = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

__global__ void tile_kernel(float* out, const float* inp, int n) {
    __shared__ float tile[256];               // 1024 bytes of static shared memory
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x] = i < n ? inp[i] : 0.0f;
    __syncthreads();
    if (i < n) out[i] = tile[blockDim.x - 1 - threadIdx.x];
}

__global__ void warp_kernel(float* out, int n) {
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    float v = warp.shfl_down((float)threadIdx.x, 1);
    if (threadIdx.x < n) out[threadIdx.x] = v;
}

__global__ void local_array_kernel(float* out, const int* idx, int n) {
    float scratch[64];                         // indexed at run time: lives in local memory
    for (int k = 0; k < 64; k++) scratch[k] = out[k * n];
    for (int k = 0; k < 8; k++) scratch[idx[k] & 63] += 1.0f;
    out[threadIdx.x] = scratch[idx[threadIdx.x] & 63];
}

__global__ void spill_kernel(float* out, const float* inp, int n) {
    float acc[32];                             // 32 live values, compiled with --maxrregcount=24
#pragma unroll
    for (int k = 0; k < 32; k++) acc[k] = inp[k * n + threadIdx.x];
    for (int it = 0; it < n; it++) {
#pragma unroll
        for (int k = 0; k < 32; k++) acc[k] = acc[k] * acc[(k + 1) % 32] + inp[it];
    }
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 32; k++) s += acc[k];
    out[threadIdx.x] = s;
}

extern "C" __global__ void c_kernel(float* out) { out[threadIdx.x] = 1.0f; }
"""


def test_parser_on_real_log(have_nvrtc):
    options = nvrtc.compile_options(80, extra=["--maxrregcount=24"])
    res = nvrtc.compile_source(REAL_SOURCE, 80, filename="real.cu", options=options)
    assert res.ok, res.log
    assert "Compiling entry function '_Z11tile_kernelPfPKfi' for 'sm_80'" in res.log
    by_name = {k.kernel: k for k in res.kernels}
    assert set(by_name) == {"tile_kernel", "warp_kernel", "local_array_kernel", "spill_kernel", "c_kernel"}
    assert by_name["tile_kernel"].mangled == "_Z11tile_kernelPfPKfi"
    assert by_name["tile_kernel"].shared_bytes == 1024
    assert by_name["warp_kernel"].shared_bytes == 0
    assert by_name["local_array_kernel"].stack_bytes >= 64 * 4
    assert by_name["spill_kernel"].spill_stores > 0 and by_name["spill_kernel"].spill_loads > 0
    assert by_name["spill_kernel"].registers <= 24
    for k in res.kernels:
        assert 0 < k.registers <= 255
        assert k.spill_stores >= 0 and k.spill_loads >= 0
    assert res.cubin_bytes > 0


def test_compile_error_is_reported(have_nvrtc, tmp_path):
    (tmp_path / "broken.cu").write_text("__global__ void broken_kernel(float* out) {\n    out[0] = undefined_name;\n}\n")
    (tmp_path / "fine.cu").write_text("__global__ void fine_kernel(float* out) { out[threadIdx.x] = 2.0f; }\n")
    ok, failures = nvrtc.check_all(archs=(80,), kernels_dir=tmp_path)
    assert not ok
    assert len(failures) == 1 and failures[0].startswith("broken.cu sm_80: broken.cu(2): error")
    rows = nvrtc.compile_report(archs=(80,), kernels_dir=tmp_path)
    assert {(r["file"], r["kernel"], r["ok"]) for r in rows} == {("broken.cu", None, False), ("fine.cu", "fine_kernel", True)}
    for r in rows:
        assert {"file", "arch", "kernel", "registers", "spill_stores", "spill_loads", "shared_bytes", "ok", "log"} <= set(r)
    table = nvrtc.format_report(rows)
    assert "FAILED" in table and "undefined_name" in table and "1/2 compilations ok" in table
    assert nvrtc.main(["--arch", "80", "--kernels-dir", str(tmp_path), "fine"]) == 0
    assert nvrtc.main(["--arch", "80", "--kernels-dir", str(tmp_path), "broken", "fine"]) == 1


def test_a_kernels_dir_without_kernels_is_one_line(tmp_path, capsys):
    # before: an empty table, "0/0 compilations ok", exit 1 (a missing folder: "no kernel file ...")
    for argv, message in ((["--kernels-dir", str(tmp_path / "nope")], f"error: --kernels-dir {tmp_path / 'nope'}: "
                                                                      "no such folder"),
                          (["--kernels-dir", str(tmp_path)], f"error: no .cu files in {tmp_path}")):
        assert nvrtc.main(argv) == 2
        out, err = capsys.readouterr()
        assert err.strip() == message and "compilations ok" not in out, (out, err)


def test_missing_nvrtc_says_what_to_install(monkeypatch):
    monkeypatch.setattr(nvrtc, "_library_candidates", lambda: [])
    monkeypatch.setattr(nvrtc.ctypes.util, "find_library", lambda name: None)
    monkeypatch.delenv("LLMCUPY_NVRTC", raising=False)
    nvrtc._load_library.cache_clear()
    try:
        with pytest.raises(nvrtc.NvrtcNotFound, match=r"nvidia-cuda-nvrtc-cu12.*pip install -e \.\[test\]"):
            nvrtc.find_nvrtc()
        monkeypatch.setenv("LLMCUPY_NVRTC", "/nonexistent/libnvrtc.so")
        with pytest.raises(nvrtc.NvrtcNotFound, match="/nonexistent/libnvrtc.so"):
            nvrtc.find_nvrtc()
    finally:
        nvrtc._load_library.cache_clear()


CONDITIONAL_SOURCE = r"""
#ifdef WITH_HALF
__global__ void half_kernel(float* out) { out[threadIdx.x] = 0.5f; }
#endif
#if 0
__global__ void removed_kernel(float* out) { out[0] = 1.0f; }
#endif
__global__ void kept_kernel(float* out) { out[threadIdx.x] = 2.0f; }
"""


@pytest.mark.parametrize("define", [False, True])
def test_kernels_in_disabled_branches_are_no_name_expressions(have_nvrtc, define):
    # the GPU path names every __global__ function as a name expression (RawModule, compile_source);
    # before, one inside a disabled #if branch was named too and NVRTC refused the whole source
    # ('identifier "removed_kernel" is undefined' in __nv_name_map)
    options = nvrtc.compile_options(80, extra=["-DWITH_HALF"] if define else [])
    res = nvrtc.compile_source(CONDITIONAL_SOURCE, 80, filename="conditional.cu", options=options)
    assert res.ok, res.log
    assert {k.kernel for k in res.kernels} == ({"half_kernel", "kept_kernel"} if define else {"kept_kernel"})
