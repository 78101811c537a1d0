"""matmul_forward beyond the generic test: the trainer's call path (bias None, the GPT-2 widths),
bad inputs, version 4's constraints, the cuBLASLt version's epilogue and the cuBLAS baseline."""

import numpy as np
import pytest

import llmcupy
from llmcupy.ops import OpError, check_outputs

OP = llmcupy.ops["matmul_forward"]


def _inputs(B=1, T=128, C=32, OC=128, has_bias=1, seed=5):
    return OP.make_inputs(np.random.default_rng(seed), B=B, T=T, C=C, OC=OC, has_bias=has_bias)


def _check(a, out):
    ref = OP.reference_fn(**a)
    for r in check_outputs(OP, ref, {"out": out}):
        assert r["ok"], r


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("oc_mult", [3, 1, 4])  # QKV, projection, MLP up (C = 32 here)
def test_trainer_widths_and_call_path(version, oc_mult):
    a = _inputs(C=128, OC=128 * oc_mult)
    out = OP(a["inp"], a["weight"], a["bias"], version=version)
    assert out.shape == (1, 128, 128 * oc_mult)
    _check(a, out)


@pytest.mark.parametrize("version", [1, 2, 4, 5])
def test_lm_head_without_bias_on_2d_input(version):
    a = _inputs(T=128, C=64, OC=256, has_bias=0)
    a["inp"] = a["inp"].reshape(128, 64)
    out = OP(a["inp"], a["weight"], None, version=version)
    assert out.shape == (128, 256)
    _check(a, out)


def test_default_version_runs():
    a = _inputs(T=3, C=5, OC=7)
    _check(a, OP(a["inp"], a["weight"], a["bias"]))


@pytest.mark.parametrize("sizes, message", [
    ({"T": 100}, "B\\*T = 100 must be a multiple of 128"),
    ({"OC": 96}, "OC = 96 must be a multiple of 128"),
    ({"C": 48}, "C = 48 must be a multiple of 32"),
])
def test_version4_refuses_shapes_it_cannot_tile(sizes, message):
    a = _inputs(**sizes)
    with pytest.raises(OpError, match=message):
        OP(a["inp"], a["weight"], a["bias"], version=4)


def test_version4_refuses_misaligned_pointers():
    a = _inputs()
    buf = np.zeros(a["weight"].size + 1, np.float32)
    w = buf[1:].reshape(a["weight"].shape)  # 4 bytes off a 16-byte boundary
    w[...] = a["weight"]
    with pytest.raises(OpError, match="weight must be 16-byte aligned"):
        OP(a["inp"], w, a["bias"], version=4)


@pytest.mark.parametrize("change, message", [
    (lambda a: a.update(weight=a["weight"][:, :-1].copy()), "columns"),
    (lambda a: a.update(bias=a["bias"][:-1].copy()), "bias must have shape"),
    (lambda a: a.update(inp=a["inp"].astype(np.float64)), "float32"),
    (lambda a: a.update(inp=a["inp"][0, 0].copy()), "inp must be"),
])
def test_bad_inputs_are_refused(change, message):
    a = _inputs(T=4, C=8, OC=8)
    change(a)
    with pytest.raises(OpError, match=message):
        OP(a["inp"], a["weight"], a["bias"], version=1)


def test_version3_adds_the_bias_in_the_gemm_epilogue(monkeypatch):
    # one cuBLASLt call carrying the bias, no bias kernel; without a bias it is a plain GEMM
    from llmcupy.runtime import blas

    assert OP.versions[3].available
    for has_bias in (1, 0):
        a = _inputs(T=5, C=24, OC=40, has_bias=has_bias)
        record = []
        monkeypatch.setattr(blas, "RECORD", record)
        out = OP(a["inp"], a["weight"], a["bias"], version=3)
        assert [with_bias for _, with_bias in record] == [bool(has_bias)]
        _check(a, out)


def test_bound_and_baseline():
    a = _inputs(T=4, C=8, OC=16)
    s = OP.sizes_of(a)
    assert OP.bound.kind == "flops" and OP.bound.flops(s) == 2 * 4 * 8 * 16
    got = OP.bound.baseline(a)
    # cuBLAS (and its NumPy stand-in, which runs the column-major call) may sum in another order than
    # NumPy's row-major product: FP32 rounding of a length-8 dot product of values in [-1, 1] is
    # below 8 * eps * sum|products| <= 8 * 1.2e-7 * 8 ~ 8e-6
    np.testing.assert_allclose(got, a["inp"].reshape(4, 8).astype(np.float64) @ a["weight"].T, atol=1e-5, rtol=0)


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5])
def test_writes_every_element_of_a_dirty_out_buffer(version):
    # the model passes its own activation buffer; nothing may be left from what was there
    a = _inputs(T=128, C=64, OC=128, has_bias=version % 2)
    buf = np.full((1, 128, 128), np.nan, np.float32)
    out = OP(a["inp"], a["weight"], a["bias"], version=version, out={"out": buf})
    assert out is buf
    _check(a, out)


# -- version 5: the warp-tiled SGEMM -------------------------------------------------------------


def test_version5_misaligned_operands_take_the_scalar_path():
    # C % 4 == 0 but weight starts 4 bytes past a 16-byte boundary: the slabs must move as floats
    a = _inputs(T=70, C=40, OC=90)
    buf = np.zeros(a["weight"].size + 1, np.float32)
    w = buf[1:].reshape(a["weight"].shape)
    w[...] = a["weight"]
    _check(a, OP(a["inp"], w, a["bias"], version=5))


def test_version5_misaligned_output_takes_scalar_stores():
    a = _inputs(T=9, C=16, OC=12)
    buf = np.full(9 * 12 + 1, np.nan, np.float32)
    out = buf[1:].reshape(1, 9, 12)
    OP.run(5, dict(a), out={"out": out})
    _check(a, out)


@pytest.mark.parametrize("order", ["forward", "reverse", "random"])
def test_version5_register_staged_path(order, no_hazards):
    # devices before sm_80 have no cp.async: the next slab goes through registers. The emulator
    # defines __CUDA_ARCH__ 800, so build that path explicitly with -DMM5_ASYNC=0.
    from llmcupy import sim
    from llmcupy.runtime.module import kernels_dir

    mod = llmcupy.RawModule(code=OP.source_code(), options=(f"-I{kernels_dir()}", "-DMM5_ASYNC=0"))
    k = mod.get_function("matmul_forward_kernel5")
    for sizes in ({"T": 130, "C": 37, "OC": 133}, {"B": 2, "T": 70, "C": 48, "OC": 129}):
        a = _inputs(**sizes)
        bt, c, oc = a["inp"].shape[0] * a["inp"].shape[1], a["inp"].shape[2], a["weight"].shape[0]
        out = np.full((bt, oc), np.nan, np.float32)
        with sim.settings(order=order, seed=3):
            k(((oc + 127) // 128, (bt + 127) // 128), (256,),
              (out, a["inp"], a["weight"], a["bias"], np.int32(bt), np.int32(c), np.int32(oc)))
        _check(a, out.reshape(a["inp"].shape[:2] + (oc,)))


def test_version5_gpt2_widths_through_the_trainer_sizes():
    # C = 768-style widths at a small B*T: several 16-wide slabs, several column tiles
    a = _inputs(T=64, C=192, OC=576)
    _check(a, OP(a["inp"], a["weight"], a["bias"], version=5))
