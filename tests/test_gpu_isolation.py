"""On a GPU, ``python -m llmcupy.kernel --all`` runs each version in a spawned child: a kernel that
faults (an illegal address poisons the CUDA context for every later launch in that process) fails
its own line and the run goes on. The same bookkeeping is tested on the emulator in test_sim.py."""

import pytest

from llmcupy.runtime import backend


@pytest.fixture
def cuda():
    """The cuda backend for one test, the emulator again after it (the suite's default)."""
    backend.set_backend("cuda")
    yield
    backend.set_backend("sim")


def _run_one_with_a_gpu_fault(op_name, number, sizes, args):
    from llmcupy import kernel

    if (op_name, number) == ("gelu_forward", 1):
        import cupy

        import llmcupy

        mod = llmcupy.RawModule(code="__global__ void fault(float* x) { x[(size_t)1 << 46] = 1.0f; }",
                                target="cuda")
        mod.get_function("fault")((1,), (1,), (cupy.zeros(1, cupy.float32),))
        cupy.cuda.get_current_stream().synchronize()  # raises: an illegal memory access
    return kernel._run_one(op_name, number, sizes, args)


@pytest.mark.gpu
def test_kernel_all_survives_a_faulting_kernel_on_gpu(cuda, monkeypatch, capsys):
    from llmcupy import kernel

    monkeypatch.setattr(kernel, "_run_one", _run_one_with_a_gpu_fault)
    rc = kernel.main(["gelu_forward", "--all", "--backend", "cuda", "--repeat", "3"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "gelu_forward version 1: ERROR" in out
    assert "1 passed, 1 failed, 0 skipped" in out  # version 2 ran in a fresh process and passed
