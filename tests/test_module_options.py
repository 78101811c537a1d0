"""What the catalogue's modules hand the compiler on a GPU: the hash of its headers (common.cuh,
async_copy.cuh) in the options (CuPy's cache key does not cover files found through -I) and no
cooperative groups where they are unused."""

import re

from llmcupy.runtime import module
from llmcupy.runtime.module import kernels_dir


def test_editing_a_catalogue_header_changes_the_options_cupy_compiles_with(tmp_path, monkeypatch):
    # CuPy's compile cache keys on the source and the options only: the hash of the headers a catalogue
    # file includes (common.cuh, and async_copy.cuh through it where used) must be in the options, or
    # an edited header reuses the old cubin. CuPy's RawModule is recorded instead of compiling.
    import cupy

    for name in ("common.cuh", "async_copy.cuh", "gelu_forward.cu", "matmul_forward.cu"):
        (tmp_path / name).write_text((kernels_dir() / name).read_text())
    monkeypatch.setattr(module, "kernels_dir", lambda: tmp_path)
    monkeypatch.setattr(module, "_FILE_MODULES", {})
    monkeypatch.setattr(module._backend, "get_backend", lambda: "cuda")
    seen = []

    class Recorder:
        def __init__(self, **kwargs):
            seen.append(kwargs["options"])

    monkeypatch.setattr(cupy, "RawModule", Recorder)

    def define(filename):
        module._FILE_MODULES.clear()
        seen.clear()
        module.load_kernel_file(filename)
        (options,) = seen
        assert options[:3] == module.DEFAULT_OPTIONS + (f"-I{tmp_path}",)
        (opt,) = [o for o in options if o.startswith("-DLLMCUPY_")]  # one hash, not two
        return opt

    assert define("gelu_forward.cu").startswith("-DLLMCUPY_INCLUDES=")
    assert '#include "async_copy.cuh"' in (tmp_path / "matmul_forward.cu").read_text()
    assert "async_copy" not in (tmp_path / "gelu_forward.cu").read_text() + (tmp_path / "common.cuh").read_text()
    for name in ("common.cuh", "async_copy.cuh"):
        before = {f: define(f) for f in ("gelu_forward.cu", "matmul_forward.cu")}
        with open(tmp_path / name, "a") as f:
            f.write("\n#define SOMETHING_NEW 1\n")
        after = {f: define(f) for f in before}
        if name == "common.cuh":
            assert after["gelu_forward.cu"] != before["gelu_forward.cu"]
            assert after["matmul_forward.cu"] != before["matmul_forward.cu"]
        else:  # only a file that includes it gets a new key
            assert after["gelu_forward.cu"] == before["gelu_forward.cu"]
            assert after["matmul_forward.cu"] != before["matmul_forward.cu"]


def test_an_edited_user_header_changes_the_options_cupy_compiles_with(tmp_path, monkeypatch):
    # CuPy's compile cache keys on the source and the options only: before, a user's RawModule whose
    # header (found through -I) was edited got the old cubin on a GPU. Checked here with CuPy's
    # RawModule recorded instead of compiling (no GPU needed).
    import cupy

    seen = []

    class Recorder:
        def __init__(self, **kwargs):
            seen.append(kwargs["options"])

    monkeypatch.setattr(cupy, "RawModule", Recorder)
    (tmp_path / "gain.h").write_text("#define GAIN 1.0f\n")
    code = '#include "gain.h"\n__global__ void k(float* y) { y[0] = GAIN; }\n'
    module.RawModule(code=code, options=(f"-I{tmp_path}",), target="cuda")
    (tmp_path / "gain.h").write_text("#define GAIN 2.0f\n")
    module.RawModule(code=code, options=(f"-I{tmp_path}",), target="cuda")
    module.RawModule(code="__global__ void k(float* y) { y[0] = 1.0f; }", options=(f"-I{tmp_path}",), target="cuda")
    first, second, plain = seen
    assert first[0] == second[0] == f"-I{tmp_path}" and first[1].startswith("-DLLMCUPY_INCLUDES=")
    assert first[1] != second[1] and len(first) == len(second) == 2
    assert plain == (f"-I{tmp_path}",)   # no user header: the options as given


def test_kernels_in_disabled_branches_are_not_name_expressions_on_the_gpu(monkeypatch):
    # every __global__ function is a name expression on the GPU path; before, one inside a disabled #if
    # branch was too, and NVRTC refused the module ('identifier "k2" is undefined' in __nv_name_map).
    # Checked with CuPy's RawModule recorded instead of compiling (no GPU needed).
    import cupy

    seen = []

    class Recorder:
        def __init__(self, **kwargs):
            seen.append(kwargs["name_expressions"])

    monkeypatch.setattr(cupy, "RawModule", Recorder)
    code = ("#ifdef TWO\n__global__ void k2(float* y) { y[0] = 2.0f; }\n#endif\n"
            "#if 0\n__global__ void gone(float* y) { y[0] = 0.0f; }\n#endif\n"
            "__global__ void k(float* y) { y[0] = 1.0f; }\n")
    module.RawModule(code=code, target="cuda")
    module.RawModule(code=code, options=("-DTWO",), target="cuda")
    assert seen == [["k"], ["k2", "k"]]


def test_cooperative_groups_only_where_used():
    # the header costs ~1 s of NVRTC per file: common.cuh must not pull it into every file
    assert "#include <cooperative_groups" not in (kernels_dir() / "common.cuh").read_text()
    for path in sorted(kernels_dir().glob("*.cu")):
        code = path.read_text()
        uses = "cg::" in code
        assert ("#include <cooperative_groups.h>" in code) == uses, path.name
        assert ("#include <cooperative_groups/reduce.h>" in code) == ("cg::reduce" in code), path.name
        if uses:  # before common.cuh, so libcu++'s FLT_MAX (CUDA 12.6+) comes first where it exists
            assert code.index("#include <cooperative_groups.h>") < code.index('#include "common.cuh"'), path.name
            assert re.search(r"^namespace cg = cooperative_groups;", code, re.M), path.name


def _header_dirs(tmp_path, runtime_has_crt: bool, nvcc_has_crt: bool):
    rt, nvcc = tmp_path / "runtime" / "include", tmp_path / "nvcc" / "include"
    for d, has in ((rt, runtime_has_crt), (nvcc, nvcc_has_crt)):
        (d / "crt").mkdir(parents=True)
        if has:
            (d / "crt" / "mma.h").write_text("// crt\n")
    (rt / "cuda_runtime.h").write_text("// runtime\n")
    return rt, nvcc


def test_mma_header_comes_from_nvccs_folder_when_cupys_lacks_it(tmp_path, monkeypatch):
    """NVIDIA's runtime wheels ship no crt/mma.h (CUDA 12: it is in nvidia-cuda-nvcc-cu12's own folder;
    CUDA 13: in nvidia-cuda-crt), and CuPy 14 compiles against the runtime wheel's headers (cuda-pathfinder's
    "cudart" folder), so <mma.h> (matmul_forward_tf32) failed with "cannot open source file crt/mma.h"."""
    from llmcupy.ops import matmul_forward_tf32
    from llmcupy.runtime import backend

    monkeypatch.setattr(module, "_FILE_MODULES", {})
    module.mma_header_dir.cache_clear()
    monkeypatch.setattr(backend, "get_backend", lambda: "cuda")
    monkeypatch.setattr(backend, "compute_capability", lambda: 90)
    try:
        rt, nvcc = _header_dirs(tmp_path, runtime_has_crt=False, nvcc_has_crt=True)
        monkeypatch.setattr(module, "_cupy_cuda_include_dir", lambda: rt)
        monkeypatch.setattr(module, "_crt_mma_candidates", lambda: [tmp_path / "absent", nvcc])
        assert module.mma_header_dir() == (nvcc, None)
        tf32 = module.load_kernel_file("matmul_forward_tf32.cu")
        assert f"-I{nvcc}" in tf32.options                              # only for the file that needs it
        assert not any(str(nvcc) in o for o in module.load_kernel_file("gelu_forward.cu").options)
        assert matmul_forward_tf32._requires({}, 256) is None

        # nowhere to be found: the version is skipped with what to install, not an NVRTC error
        module.mma_header_dir.cache_clear()
        monkeypatch.setattr(module, "_crt_mma_candidates", lambda: [tmp_path / "absent"])
        reason = matmul_forward_tf32._requires({}, 256)
        assert reason and "crt/mma.h" in reason and "nvidia-cuda-crt" in reason and str(rt) in reason

        # CuPy's own folder has it (a toolkit, or the CUDA 13 runtime wheel with nvidia-cuda-crt): nothing added
        module.mma_header_dir.cache_clear()
        rt2, _ = _header_dirs(tmp_path / "with", runtime_has_crt=True, nvcc_has_crt=False)
        monkeypatch.setattr(module, "_cupy_cuda_include_dir", lambda: rt2)
        assert module.mma_header_dir() == (None, None) and module._mma_options("#include <mma.h>") == ()
    finally:
        module.mma_header_dir.cache_clear()
