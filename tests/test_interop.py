"""PyTorch tensors through an op via DLPack: CPU tensors in the emulator, CUDA tensors on a GPU."""

import numpy as np
import pytest

import llmcupy
from llmcupy.ops import OpError

torch = pytest.importorskip("torch")


def test_a_torch_cpu_tensor_goes_through_an_op_in_the_emulator():
    x = torch.randn(4, 8, 64)
    y = llmcupy.ops["gelu_forward"](x, version=1)
    assert isinstance(y, torch.Tensor) and y.shape == x.shape
    expected = torch.nn.functional.gelu(x, approximate="tanh")
    assert torch.allclose(y, expected, atol=1e-6)


def test_several_outputs_come_back_as_tensors():
    x, w, b = torch.randn(3, 5, 64), torch.ones(64), torch.zeros(64)
    out, mean, rstd = llmcupy.ops["layernorm_forward"](x, w, b, version=3)
    assert all(isinstance(t, torch.Tensor) for t in (out, mean, rstd))
    ref = torch.nn.functional.layer_norm(x, (64,), w, b, eps=1e-5)
    assert torch.allclose(out, ref, atol=1e-5)


def test_mixed_numpy_and_torch_inputs():
    a = torch.randn(2, 4, 32)
    b = np.random.randn(2, 4, 32).astype(np.float32)
    out = llmcupy.ops["residual_forward"](a, b, version=1)
    assert isinstance(out, torch.Tensor)
    assert torch.allclose(out, a + torch.from_numpy(b))


def test_a_tensor_on_another_device_is_refused_with_a_clear_message():
    meta = torch.empty(4, 64, device="meta")
    with pytest.raises(OpError, match="the emulator runs on the CPU and needs a CPU tensor"):
        llmcupy.ops["gelu_forward"](meta, version=1)


def test_a_non_contiguous_tensor_updated_in_place_is_refused():
    # DLPack needs a contiguous tensor, so a transposed one reaches the kernel as a copy: an op that
    # updates it in place (matmul_backward's dinp/dweight) would leave the caller's tensor unchanged
    rng = np.random.default_rng(0)
    u = lambda *s: torch.from_numpy(rng.uniform(-1, 1, size=s).astype(np.float32))  # noqa: E731
    dout, inp, weight = u(2, 3, 8), u(2, 3, 4), u(8, 4)
    dweight = u(4, 8).T  # (8, 4), not contiguous
    dinp = torch.zeros(2, 3, 4)
    with pytest.raises(OpError, match="input 'dweight' is updated in place, but the PyTorch tensor is not contiguous"):
        llmcupy.ops["matmul_backward"](dinp, dweight, None, dout, inp, weight, version=1)
    # a non-contiguous input that is only read is fine (its copy is read)
    x = u(64, 4).T
    y = llmcupy.ops["gelu_forward"](x, version=1)
    assert torch.allclose(y, torch.nn.functional.gelu(x, approximate="tanh"), atol=1e-6)
    # contiguous, the update lands in the caller's tensor
    dweight = dweight.contiguous()
    before = dweight.clone()
    llmcupy.ops["matmul_backward"](dinp, dweight, torch.zeros(8), dout, inp, weight, version=1)
    expected = before + dout.reshape(6, 8).T @ inp.reshape(6, 4)
    assert torch.allclose(dweight, expected, atol=1e-5)


@pytest.mark.gpu
def test_a_torch_cuda_tensor_goes_through_an_op_on_a_gpu():
    llmcupy.set_backend("cuda")
    try:
        x = torch.randn(4, 8, 64, device="cuda")
        y = llmcupy.ops["gelu_forward"](x, version=2)
        assert isinstance(y, torch.Tensor) and y.is_cuda
        assert torch.allclose(y, torch.nn.functional.gelu(x, approximate="tanh"), atol=1e-5)
        with pytest.raises(OpError, match="CPU tensor"):
            llmcupy.ops["gelu_forward"](x.cpu(), version=2)
    finally:
        llmcupy.set_backend("sim")
