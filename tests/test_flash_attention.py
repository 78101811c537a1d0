"""flash_attention_forward / flash_attention_backward beyond the generic test: agreement with the
classic attention ops (which materialise att), the memory contract (no T x T buffer), bad inputs."""

import numpy as np
import pytest

import llmcupy
from llmcupy.ops import OpError, check_outputs

FWD = llmcupy.ops["flash_attention_forward"]
BWD = llmcupy.ops["flash_attention_backward"]


@pytest.mark.parametrize("order", ["forward", "reverse", "random"])
def test_forward_and_backward_agree_with_the_classic_versions(order, no_hazards):
    from llmcupy import sim

    rng = np.random.default_rng(4)
    B, T, C, NH = 1, 67, 24, 3   # HS = 8, T past one 64-row block and two 32-key tiles
    inp = rng.uniform(-1, 1, (B, T, 3 * C)).astype(np.float32)
    dout = rng.uniform(-1, 1, (B, T, C)).astype(np.float32)
    with sim.settings(order=order, seed=2):
        out, lse = FWD(inp, NH)
        dinp = BWD(dout, inp, out, lse, NH)
        classic_out, att, _ = llmcupy.ops["attention_forward"](inp, NH, version=1)
        classic_dinp, _, _ = llmcupy.ops["attention_backward"](dout, inp, att, NH, version=8)
    np.testing.assert_allclose(out, classic_out, atol=1e-5)
    np.testing.assert_allclose(dinp, classic_dinp, atol=1e-5)
    # lse is the log of the softmax's normaliser: exp(s - lse) sums to one along each row
    q = inp[0, :, :C].reshape(T, NH, 8).transpose(1, 0, 2).astype(np.float64)
    k = inp[0, :, C:2 * C].reshape(T, NH, 8).transpose(1, 0, 2).astype(np.float64)
    s = q @ k.transpose(0, 2, 1) / np.sqrt(8)
    p = np.where(np.tril(np.ones((T, T), bool)), np.exp(s - lse[0][:, :, None]), 0.0)
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)


def test_outputs_hold_no_t_by_t_buffer():
    a = FWD.make_inputs(np.random.default_rng(0), B=2, T=9, C=16, NH=2)
    out, lse = FWD(a["inp"], a["NH"])
    assert out.shape == (2, 9, 16) and lse.shape == (2, 2, 9)
    b = BWD.make_inputs(np.random.default_rng(0), B=2, T=9, C=16, NH=2)
    dinp = BWD(b["dout"], b["inp"], b["out"], b["lse"], b["NH"])
    assert dinp.shape == (2, 9, 48)
    for r in check_outputs(BWD, BWD.reference_fn(**b), {"dinp": dinp}):
        assert r["ok"], r


def test_head_size_over_64_is_refused_with_the_reason():
    a = FWD.make_inputs(np.random.default_rng(0), B=1, T=4, C=160, NH=2)   # HS = 80
    with pytest.raises(OpError, match="head size C / NH = 80 is over 64"):
        FWD(a["inp"], a["NH"])


def test_backward_checks_the_forward_outputs_shapes():
    b = BWD.make_inputs(np.random.default_rng(0), B=1, T=5, C=8, NH=2)
    with pytest.raises(OpError, match="lse must be"):
        BWD(b["dout"], b["inp"], b["out"], b["lse"][:, :1].copy(), b["NH"])
    with pytest.raises(OpError, match="out must be"):
        BWD(b["dout"], b["inp"], b["out"][:, :4].copy(), b["lse"], b["NH"])
