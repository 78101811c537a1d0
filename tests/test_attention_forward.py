"""Op-specific checks for attention_forward, trimat_forward and the attention layout permutes.

The generic test (test_ops.py) compares every version's outputs with the reference; here: each
version's preatt scratch convention, outputs that start as NaN (nothing may rely on zeroed memory),
large scores, the cuBLAS baselines, round trips of the layout kernels, and bad inputs.
"""

import math

import numpy as np
import pytest

import llmcupy
from llmcupy import sim
from llmcupy.ops import OpError, check_outputs

FWD = llmcupy.ops["attention_forward"]
TRIMAT = llmcupy.ops["trimat_forward"]


@pytest.fixture(autouse=True)
def _one_worker():
    # These tests launch in the pytest process itself. The emulator's worker threads do not survive
    # the fork of test_ops.py's run_isolated, and a forked child that launches from a library whose
    # pool already started threads waits for them forever; one worker never starts any.
    with sim.settings(workers=1):
        yield


def _inputs(op, seed=0, **sizes):
    return op.make_inputs(np.random.default_rng(seed), **sizes)


def _launch_with(op, number, inputs, outputs, bs=256, **scratch):
    """Runs a version's launcher on caller-provided outputs (and scratch), as the trainer does."""
    op.versions[number].launch({**inputs, **outputs, **scratch}, bs)
    return outputs


def _nan_outputs(op, inputs):
    return {k: np.full(v.shape, np.nan, dtype=np.float32) for k, v in op.allocate_fn(np, inputs).items()}


@pytest.mark.parametrize("number", [1, 2, 3, 4])
@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_outputs_need_no_zeroed_memory(number, order, no_hazards):
    inputs = _inputs(FWD, B=2, T=20, C=24, NH=3)
    ref = FWD.reference_fn(**inputs)
    with sim.settings(order=order):
        got = _launch_with(FWD, number, inputs, _nan_outputs(FWD, inputs), bs=64)
    for r in check_outputs(FWD, ref, got):
        assert r["ok"], r
    upper = np.triu(np.ones((20, 20), dtype=bool), 1)
    assert (got["att"][..., upper] == 0.0).all(), "att must be exactly zero above the diagonal"


@pytest.mark.parametrize("number", [1, 3, 4])
def test_preatt_convention_per_version(number, no_hazards):
    B, T, C, NH = 1, 16, 24, 2
    HS = C // NH
    inputs = _inputs(FWD, B=B, T=T, C=C, NH=NH)
    preatt = np.full((B, NH, T, T), np.nan, dtype=np.float32)
    _launch_with(FWD, number, inputs, _nan_outputs(FWD, inputs), preatt=preatt)
    x = inputs["inp"].astype(np.float64).reshape(B, T, 3, NH, HS)
    q, k = x[:, :, 0].transpose(0, 2, 1, 3), x[:, :, 1].transpose(0, 2, 1, 3)
    raw = q @ k.swapaxes(-1, -2)
    lower = np.tril(np.ones((T, T), dtype=bool))
    if number == 4:  # the trainer's convention: unscaled, full T x T
        np.testing.assert_allclose(preatt, raw, atol=1e-5, rtol=1e-5)
    else:            # llm.c's CPU-reference convention: scaled, -inf above the diagonal
        np.testing.assert_allclose(preatt[..., lower], (raw / math.sqrt(HS))[..., lower], atol=1e-5, rtol=1e-5)
        assert np.isneginf(preatt[..., ~lower]).all()


@pytest.mark.parametrize("number", [1, 2, 3, 4])
def test_large_scores_stay_finite(number, no_hazards):
    # scores of several hundred: a naive exp overflows, -inf - -inf would give NaN
    inputs = _inputs(FWD, seed=3, B=1, T=40, C=16, NH=2)
    inputs["inp"] *= np.float32(12.0)
    ref = FWD.reference_fn(**inputs)
    got = FWD.run(number, {k: np.array(v, copy=True) for k, v in inputs.items()}, 128)
    for r in check_outputs(FWD, ref, got):
        assert r["ok"], r
    assert np.isfinite(got["att"]).all() and np.isfinite(got["out"]).all()


def test_call_with_python_int_and_layouts():
    inputs = _inputs(FWD, B=2, T=8, C=12, NH=3)
    out, att, qkvr = FWD(inputs["inp"], 3)
    assert out.shape == (2, 8, 12) and att.shape == (2, 3, 8, 8) and qkvr.shape == (3, 2, 3, 8, 4)
    # qkvr[1] is k: k[b, h, t, d] = inp[b, t, C + h*HS + d]
    assert qkvr[1, 1, 2, 5, 3] == inputs["inp"][1, 5, 12 + 2 * 4 + 3]
    np.testing.assert_allclose(att.sum(axis=-1), 1.0, atol=1e-5)


def test_baselines_match_references():
    inputs = _inputs(FWD, B=1, T=12, C=16, NH=2)
    np.testing.assert_allclose(FWD.bound.baseline(inputs), FWD.reference_fn(**inputs)["out"], atol=1e-5)
    t_inputs = _inputs(TRIMAT, B=1, T=12, C=16, NH=2)
    ref = TRIMAT.reference_fn(**t_inputs)["out"]
    base = TRIMAT.bound.baseline(t_inputs)
    finite = np.isfinite(ref)
    np.testing.assert_allclose(base[finite], ref[finite], atol=1e-5)


def test_sizes_past_the_int_indices_of_versions_1_to_3_are_refused_not_wrapped():
    # B*NH*T*T = 2^31 wraps negative in versions 1-3's int indices: no thread would write (silently
    # wrong results, reachable on an 80 GB GPU). The input is small at C = 8 (200 MB of zeros, pages
    # never touched); the refusal comes before the 8 GB outputs are allocated.
    B, NH, T, C = 2048, 1, 1024, 8
    assert B * NH * T * T == 2**31
    huge = np.zeros((B, T, 3 * C), dtype=np.float32)
    for number in (1, 2, 3):
        with pytest.raises(OpError, match=rf"version {number}: B\*NH\*T\*T = 2147483648 score elements: more "
                                          r"than version \d's int indices reach \(2\^31 - 1\); use a smaller B or T"):
            FWD(huge, NH, version=number)
    from llmcupy.ops._attention import int_index_problem
    assert int_index_problem(2047, 1, 1024, 1) is None and int_index_problem(1, 1, 46340, 1) is None
    assert int_index_problem(1, 1, 46341, 1) is not None   # 46341^2 > 2^31 - 1


def test_bad_inputs_are_refused():
    inputs = _inputs(FWD, B=1, T=8, C=12, NH=3)
    with pytest.raises(OpError, match="multiple of NH"):
        FWD(inputs["inp"], 5)
    with pytest.raises(OpError, match="integer"):
        FWD(inputs["inp"], 3.0)
    with pytest.raises(OpError, match="3-D"):
        FWD(inputs["inp"][0], 3)
    with pytest.raises(OpError, match="float32"):
        FWD(inputs["inp"].astype(np.float64), 3)
    odd = _inputs(FWD, B=1, T=7, C=12, NH=3)
    with pytest.raises(OpError, match="multiple of 4"):
        FWD(odd["inp"], 3, version=4)
    for number in (5, 6, 10):
        with pytest.raises(OpError, match="needs BF16 activations"):
            FWD(inputs["inp"], 3, version=number)
    with pytest.raises(OpError, match="multiple of 128"):
        TRIMAT(inputs["inp"], 3, version=1)
    t = _inputs(TRIMAT, B=1, T=128, C=24, NH=2)
    with pytest.raises(OpError, match="multiple of 32"):
        TRIMAT(t["inp"], 2, version=4)


def test_layout_round_trips(no_hazards):
    rng = np.random.default_rng(5)
    B, T, C, NH = 2, 9, 20, 4
    inp = rng.uniform(-1, 1, size=(B, T, 3 * C)).astype(np.float32)
    qkvr = llmcupy.ops["attention_permute"](inp, NH, block_size=64)
    back = llmcupy.ops["attention_permute_backward"](qkvr, block_size=128)
    assert np.array_equal(back, inp)
    y = rng.uniform(-1, 1, size=(B, NH, T, C // NH)).astype(np.float32)
    flat = llmcupy.ops["attention_unpermute"](y, block_size=32)
    assert np.array_equal(llmcupy.ops["attention_unpermute_backward"](flat, NH), y)
    x = rng.uniform(-1, 1, size=(2, 3, 4, 5)).astype(np.float32)
    assert np.array_equal(llmcupy.ops["permute"](x), np.transpose(x, (3, 2, 0, 1)))
