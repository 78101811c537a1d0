"""The eager launch path: launch plans (checked once per (op, version, shapes), then replayed),
the stubbed-launch benchmark and the launch counter."""

import numpy as np
import pytest

import llmcupy
from llmcupy.ops import OpError, _op
from llmcupy.runtime import module as rt


@pytest.fixture(autouse=True)
def fresh_plans():
    _op.clear_plans()
    yield
    _op.clear_plans()


def _ln_inputs(B=2, T=5, C=16, seed=0):
    return llmcupy.ops["layernorm_forward"].make_inputs(np.random.default_rng(seed), B=B, T=T, C=C)


def test_replay_gives_the_checked_result_and_records_one_plan():
    op = llmcupy.ops["layernorm_forward"]
    a = _ln_inputs()
    with _op.launch_plans(False):
        first = op.run(None, dict(a))
    assert _op.plans_cached() == 0
    second = op.run(None, dict(a))          # checked, records the plan
    assert _op.plans_cached() == 1
    third = op.run(None, dict(a))           # replayed
    assert _op.plans_cached() == 1
    for k in op.outputs:
        np.testing.assert_array_equal(first[k], second[k])
        np.testing.assert_array_equal(first[k], third[k])


def test_replay_skips_the_checks_and_the_kernel_argument_checks(monkeypatch):
    op = llmcupy.ops["gelu_forward"]
    # x and y 256 bytes apart in one buffer: equally aligned (a less aligned array is checked again)
    buf = np.random.default_rng(1).uniform(-1, 1, 256).astype(np.float32)
    x, y = buf[:48].reshape(2, 3, 8), buf[128:176].reshape(2, 3, 8)
    out = np.empty_like(x)
    op.run(2, {"inp": x}, out={"out": out})
    calls = []
    monkeypatch.setattr(op, "validate_fn", lambda a: calls.append("validate"))
    monkeypatch.setattr(rt, "check_arguments", lambda *a: calls.append("check_arguments"))
    op.run(2, {"inp": y}, out={"out": out}, host_checks=False)
    assert calls == []
    np.testing.assert_allclose(out, op.reference(y), atol=1e-5)


def test_host_checks_still_run_on_a_replay():
    # host checks read values (token ids), which the plan key cannot see
    op = llmcupy.ops["encoder_forward"]
    a = op.make_inputs(np.random.default_rng(0), B=1, T=4, C=8, V=10)
    op.run(None, dict(a))
    bad = dict(a, tokens=np.full_like(a["tokens"], 99))
    with pytest.raises(OpError):
        op.run(None, bad)


def test_a_new_shape_is_checked_again():
    op = llmcupy.ops["matmul_forward"]
    rng = np.random.default_rng(0)
    a = op.make_inputs(rng, B=1, T=128, C=32, OC=128)
    op.run(4, dict(a))
    op.run(4, dict(a))
    b = op.make_inputs(rng, B=1, T=100, C=32, OC=128)
    with pytest.raises(OpError, match="multiple of 128"):
        op.run(4, dict(b))


def test_a_less_aligned_array_is_checked_again():
    op = llmcupy.ops["gelu_forward"]
    buf = np.zeros(512, np.float32)
    o = next(o for o in range(64) if _op._alignment(buf[o:]) == 256)
    aligned, shifted = buf[o:o + 48].reshape(2, 3, 8), buf[o + 4:o + 52].reshape(2, 3, 8)  # 16 bytes further
    out = np.empty((2, 3, 8), np.float32)
    op.run(2, {"inp": aligned}, out={"out": out})
    (plan,) = op._plans.values()
    assert not plan.aligned_as_before({"inp": shifted}, {"out": out})
    shifted[...] = 0.5
    got = op.run(2, {"inp": shifted}, out={"out": out})  # checked again (float4: 16 bytes suffice)
    np.testing.assert_allclose(got["out"], op.reference(shifted), atol=1e-6)


def test_a_misaligned_array_is_refused_after_a_plan_was_recorded():
    op = llmcupy.ops["matmul_forward"]
    a = op.make_inputs(np.random.default_rng(0), B=1, T=128, C=32, OC=128)
    op.run(4, dict(a))
    op.run(4, dict(a))
    buf = np.zeros(a["weight"].size + 1, np.float32)
    w = buf[1:].reshape(a["weight"].shape)
    w[...] = a["weight"]
    with pytest.raises(OpError, match="weight must be 16-byte aligned"):
        op.run(4, dict(a, weight=w))


def test_outputs_updated_in_place_are_rebuilt_on_a_replay():
    # matmul_backward's outputs are its dinp/dweight/dbias inputs (accumulated into): a replay must
    # hand back the arrays of *this* call, not the recorded call's
    op = llmcupy.ops["matmul_backward"]
    a = op.make_inputs(np.random.default_rng(0), B=1, T=3, C=8, OC=12)
    op.run(None, {k: (None if v is None else v.copy()) for k, v in a.items()}, out={})
    b = {k: (None if v is None else v.copy()) for k, v in a.items()}
    got = op.run(None, b, out={})
    for name in op.outputs:
        assert got[name] is b[name]
    ref = op.reference(**a)
    for name, r in zip(op.outputs, ref):
        if r is not None:
            np.testing.assert_allclose(got[name], r, rtol=1e-4, atol=1e-4)


def test_launch_counter_counts_kernel_launches():
    op = llmcupy.ops["gelu_forward"]
    x = np.zeros((1, 2, 8), np.float32)
    before = rt.launch_count()
    op(x, version=1)
    op(x, version=1)
    assert rt.launch_count() - before == 2


def test_stubbed_launches_run_no_kernel():
    op = llmcupy.ops["gelu_forward"]
    x = np.ones((1, 2, 8), np.float32)
    out = np.full_like(x, 7.0)
    with rt.STUBBED:
        op.run(1, {"inp": x}, out={"out": out})
    assert (out == 7.0).all()


def test_launch_benchmark_reports_both_paths():
    from llmcupy import launchbench

    r = launchbench.measure(init="d1", B=1, T=4, repeats=1)
    assert r["op_calls_per_step"] > 0 and r["launches_per_step"] >= r["op_calls_per_step"] - r["library_op_calls_per_step"]
    for label in ("checked", "planned"):
        assert r[label]["us_per_op_call"] > 0 and r[label]["kernel_only_us_per_launch"] > 0
    assert "us/launch" in launchbench.format_result(r)


@pytest.mark.gpu
def test_replayed_launches_on_a_gpu_match_checked_ones():
    # the trusted launch path hands CuPy arrays and a NULL pointer (bias None) straight to CuPy
    import cupy

    llmcupy.set_backend("cuda")
    try:
        op = llmcupy.ops["matmul_forward"]
        a = op.make_inputs(np.random.default_rng(0), B=1, T=130, C=37, OC=133, has_bias=0)
        arrays = {k: (None if v is None else cupy.asarray(v)) for k, v in a.items()}
        with _op.launch_plans(False):
            checked = cupy.asnumpy(op.run(5, dict(arrays))["out"])
        op.run(5, dict(arrays))
        replayed = cupy.asnumpy(op.run(5, dict(arrays))["out"])
        np.testing.assert_array_equal(checked, replayed)
        from llmcupy import launchbench

        r = launchbench.measure(init="d1", B=1, T=4, repeats=2)
        assert r["planned"]["us_per_op_call"] > 0
    finally:
        llmcupy.set_backend("sim")
