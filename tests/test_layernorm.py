"""layernorm_forward / layernorm_backward specifics the generic op test does not cover."""

import numpy as np
import pytest

import llmcupy
from llmcupy import sim
from llmcupy.ops import OpError, check_outputs


def _fresh(inputs):
    return {k: np.array(v, copy=True) for k, v in inputs.items()}


def _assert_ok(op, ref, got):
    for r in check_outputs(op, ref, got):
        assert r["ok"], r


def test_forward_v3_skips_null_statistics(no_hazards):
    op = llmcupy.ops["layernorm_forward"]
    a = op.make_inputs(np.random.default_rng(1), B=1, T=5, C=100)
    ref = op.reference_fn(**_fresh(a))
    n, c = 5, 100
    out = np.empty_like(a["inp"])
    op.kernel("layernorm_forward_kernel3")((1,), (512,), (out, None, None, a["inp"], a["weight"], a["bias"],
                                                          np.int32(n), np.int32(c)))
    atol, rtol = op.tolerance["out"]
    assert np.all(np.abs(out - ref["out"]) <= atol + rtol * np.abs(ref["out"]))


def test_forward_trainer_configuration(no_hazards):
    # the fp32 trainer: version 3, block 512 (16 rows per block), C = 768, N not a multiple of 16
    op = llmcupy.ops["layernorm_forward"]
    a = op.make_inputs(np.random.default_rng(2), B=1, T=17, C=768)
    _assert_ok(op, op.reference_fn(**_fresh(a)), op.run(3, _fresh(a), 512))


def test_forward_v6_falls_back_when_shared_memory_is_too_small(no_hazards):
    # (2 + 1024/32) * 2000 * 4 bytes = 272,000 > 227 KiB: version 5 runs instead, still correct
    op = llmcupy.ops["layernorm_forward"]
    a = op.make_inputs(np.random.default_rng(3), B=1, T=2, C=2000)
    _assert_ok(op, op.reference_fn(**_fresh(a)), op.run(6, _fresh(a), 1024))


def test_forward_v6_falls_back_at_the_emulators_own_shared_memory_limit(no_hazards, monkeypatch):
    # version 6 decides whether it fits by the limit the emulator enforces, not a copy of that number:
    # with a lower limit, (2 + 256/32) * 2000 * 4 = 80,000 bytes runs version 5 instead of being refused
    from llmcupy.runtime import module

    monkeypatch.setattr(module, "ANY_GPU_SHARED_BYTES", 64 * 1024)
    op = llmcupy.ops["layernorm_forward"]
    a = op.make_inputs(np.random.default_rng(3), B=1, T=2, C=2000)
    _assert_ok(op, op.reference_fn(**_fresh(a)), op.run(6, _fresh(a), 256))


def test_forward_rejects_bad_inputs():
    op = llmcupy.ops["layernorm_forward"]
    a = op.make_inputs(np.random.default_rng(0), B=1, T=2, C=8)
    with pytest.raises(OpError, match="weight must have shape"):
        op(a["inp"], a["weight"][:4], a["bias"])
    with pytest.raises(OpError, match="float32"):
        op(a["inp"].astype(np.float64), a["weight"], a["bias"])
    b = op.make_inputs(np.random.default_rng(0), B=1, T=2, C=7)
    with pytest.raises(OpError, match="multiple of 4"):
        op(b["inp"], b["weight"], b["bias"], version=6)


@pytest.mark.parametrize("version", [1, 2, 3, 5, 6, 7, 8, 9, 10])
def test_backward_accumulates_across_calls(version, no_hazards):
    # two calls on the same buffers add the gradient twice (dweight/dbias included: llm.c's
    # versions 2, 6 and 7 overwrite them, ours accumulate like the trainer needs)
    op = llmcupy.ops["layernorm_backward"]
    a = op.make_inputs(np.random.default_rng(4), B=1, T=3, C=132)
    once = op.reference_fn(**_fresh(a))
    twice = op.reference_fn(**{**_fresh(a), "dinp": once["dinp"], "dweight": once["dweight"], "dbias": once["dbias"]})
    arrays = _fresh(a)
    op.run(version, arrays, 64)
    got = op.run(version, arrays, 64)
    _assert_ok(op, twice, got)


def test_backward_trainer_configuration(no_hazards):
    # the fp32 trainer: version 2, block 512, C = 768
    op = llmcupy.ops["layernorm_backward"]
    a = op.make_inputs(np.random.default_rng(5), B=1, T=19, C=768)
    _assert_ok(op, op.reference_fn(**_fresh(a)), op.run(2, _fresh(a), 512))


@pytest.mark.parametrize("version", [8, 9, 10])
def test_backward_handles_c_not_a_multiple_of_128(version, no_hazards):
    # llm.c's 8 skips the last C % 128 channels and 9 refuses such C (C = 1600 in its harness)
    op = llmcupy.ops["layernorm_backward"]
    a = op.make_inputs(np.random.default_rng(6), B=1, T=2, C=1600)
    _assert_ok(op, op.reference_fn(**_fresh(a)), op.run(version, _fresh(a), 256))


@pytest.mark.parametrize("version", [9, 10])
def test_backward_parameter_sums_are_deterministic(version, no_hazards):
    # no atomics on the partials: the blocks are summed in index order whichever block is last
    op = llmcupy.ops["layernorm_backward"]
    a = op.make_inputs(np.random.default_rng(7), B=2, T=9, C=96)
    results = []
    for order in ("forward", "reverse", "random"):
        with sim.settings(order=order, seed=3):
            got = op.run(version, _fresh(a), 32)
        results.append((got["dweight"].copy(), got["dbias"].copy()))
    for dw, db in results[1:]:
        assert np.array_equal(dw, results[0][0]) and np.array_equal(db, results[0][1])


def test_backward_rejects_bad_inputs():
    op = llmcupy.ops["layernorm_backward"]
    a = op.make_inputs(np.random.default_rng(0), B=1, T=2, C=37)
    with pytest.raises(OpError, match="multiple of 4"):
        op.run(10, _fresh(a), 256)
    bad = _fresh(a)
    bad["mean"] = bad["mean"].reshape(-1)
    with pytest.raises(OpError, match="mean must have shape"):
        op.run(2, bad, 256)
    with pytest.raises(OpError, match="unavailable"):
        op.run(4, _fresh(a), 256)
