"""GPU-only checks: run with a CUDA device (`LLMCUPY_BACKEND=cuda pytest -m gpu`); skipped without one."""

import numpy as np
import pytest

import llmcupy
from llmcupy.ops import check_outputs
from llmcupy.runtime import DeviceLimitError

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def cuda_backend():
    llmcupy.set_backend("cuda")
    yield
    llmcupy.set_backend("sim")


def _cases():
    for name in llmcupy.ops:
        op = llmcupy.ops[name]
        for number, v in sorted(op.versions.items()):
            if v.available:
                yield pytest.param(name, number, id=f"{name}-v{number}")


@pytest.mark.parametrize("name,number", list(_cases()))
def test_version_on_gpu_matches_reference(name, number):
    import cupy

    op = llmcupy.ops[name]
    version = op.versions[number]
    ran, too_large = 0, []
    for shape_index, shape in enumerate(op.test_shapes):
        inputs = op.make_inputs(np.random.default_rng(shape_index), **shape)
        ref = op.reference_fn(**{k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v) for k, v in inputs.items()})
        for bs in version.block_sizes or (None,):
            if version.requires is not None and version.requires(inputs, bs):
                continue
            arrays = {k: (cupy.asarray(v) if isinstance(v, np.ndarray) else v) for k, v in inputs.items()}
            try:
                got = op.run(number, arrays, bs)
            except DeviceLimitError as exc:
                # a block size this device cannot hold (e.g. 1024 threads of a kernel needing more
                # than 64 registers on a 64K-register GPU): the catalogue reports it as skipped too;
                # NVRTC shows which in CI (test_launch_limits)
                too_large.append(str(exc))
                continue
            for r in check_outputs(op, ref, got, inputs=inputs):
                assert r["ok"], f"{name} v{number} block {bs} shape {shape}: {r}"
            ran += 1
    # without a count, a version whose every launch hit a device limit (or was refused) passed
    # having checked nothing
    if not ran:
        if too_large:
            pytest.skip(f"{name} v{number}: no launch fits this device: {too_large[0]}")
        pytest.fail(f"{name} v{number}: no block size of its sweep accepts any test shape")


def test_python_int_is_refused_on_gpu_too():
    import cupy

    mod = llmcupy.RawModule(code="__global__ void k(float* x, int n) { if (threadIdx.x < n) x[threadIdx.x] = 1; }")
    x = cupy.zeros(32, cupy.float32)
    with pytest.raises(llmcupy.KernelArgumentError, match=r"k: argument 1 \(int n\): got a Python int"):
        mod.get_function("k")((1,), (32,), (x, 32))
    with pytest.raises(llmcupy.KernelArgumentError, match="NumPy \\(host\\) array"):
        mod.get_function("k")((1,), (32,), (np.zeros(32, np.float32), np.int32(32)))
    mod.get_function("k")((1,), (32,), (x, np.int32(16)))
    assert float(x.sum()) == 16.0


def test_an_edited_user_header_is_compiled_again_on_gpu(tmp_path):
    # CuPy's compile cache keys on the source and the options: without the headers' hash among the
    # options, the second module would run the first build's cubin (GAIN 1)
    import cupy

    (tmp_path / "gain.h").write_text("#define GAIN 1.0f\n")
    code = '#include "gain.h"\n__global__ void k(float* y) { y[threadIdx.x] = GAIN; }\n'
    for gain in (1.0, 2.0):
        (tmp_path / "gain.h").write_text(f"#define GAIN {gain}f\n")
        y = cupy.zeros(4, cupy.float32)
        llmcupy.RawModule(code=code, options=(f"-I{tmp_path}",)).get_function("k")((1,), (4,), (y,))
        assert y.get().tolist() == [gain] * 4


def test_half_and_vector_arguments_are_checked_on_gpu_too():
    import cupy

    mod = llmcupy.RawModule(code="#include <cuda_fp16.h>\n"
                                 "__global__ void h(half* y, const __half* x) { y[threadIdx.x] = x[threadIdx.x]; }\n")
    k = mod.get_function("h")
    x = cupy.arange(4, dtype=cupy.float16)
    y = cupy.zeros(4, cupy.float16)
    k((1,), (4,), (y, x))
    assert y.get().tolist() == [0, 1, 2, 3]
    with pytest.raises(llmcupy.KernelArgumentError, match=r"argument 1 \(const __half\* x\): expected an array of "
                                                          r"float16, got float32"):
        k((1,), (4,), (y, x.astype(cupy.float32)))
