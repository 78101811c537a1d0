"""The eager launch path: launch plans (checked once per (op, version, shapes), then replayed),
the stubbed-launch benchmark and the launch counter."""

import json

import numpy as np
import pytest

import llmcupy
from llmcupy import sim
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
    with pytest.raises(OpError, match=r"token id 99 is out of range \[0, 10\)"):
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
    # the plan keeps the alignment the checks required (float4: 16 bytes), not the one the recorded
    # address happened to have: 16 bytes further is replayed, 4 bytes further is checked again
    op = llmcupy.ops["gelu_forward"]
    buf = np.zeros(512, np.float32)
    o = next(o for o in range(64) if _op._alignment(buf[o:]) == 256)
    aligned, shifted = buf[o:o + 48].reshape(2, 3, 8), buf[o + 4:o + 52].reshape(2, 3, 8)  # 16 bytes further
    skewed = buf[o + 1:o + 49].reshape(2, 3, 8)                                           # 4 bytes further
    out = np.empty((2, 3, 8), np.float32)
    op.run(2, {"inp": aligned}, out={"out": out})
    (plan,) = op._plans.values()
    assert plan.aligned_as_before({"inp": shifted}, {"out": out})
    assert not plan.aligned_as_before({"inp": skewed}, {"out": out})
    shifted[...] = 0.5
    got = op.run(2, {"inp": shifted}, out={"out": out})
    np.testing.assert_allclose(got["out"], op.reference(shifted), atol=1e-6)
    with pytest.raises(OpError, match="16-byte aligned"):
        op.run(2, {"inp": skewed}, out={"out": out})


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
    fresh = lambda: {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in a.items()}  # noqa: E731
    op.run(None, fresh(), out={})
    b = fresh()
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
        assert r[label]["in_step_kernel_only_us_per_op_call"] > 0
    assert "us/launch" in launchbench.format_result(r)


@pytest.mark.parametrize("argv,message", [
    (["--init", "d3"], "argument --init: invalid choice: 'd3' (choose from 'narrow12', 'd1', "),
    (["-b", "0"], "argument -b/--batch-size: needs an integer >= 1, got 0"),
    (["-t", "0"], "argument -t/--seq-len: needs an integer >= 1, got 0"),
    (["--repeats", "0"], "argument --repeats: needs an integer >= 1, got 0"),
    (["--init", "d1", "-t", "257"], "error: T=257 is larger than the model's context (max_seq_len=256)"),
    (["--json", "{tmp}"], "error: --json {tmp}: it is a folder; give a file name"),
    (["--backend", "sim", "--json", "{tmp}/no/such.json"], "error: --json {tmp}/no/such.json: the folder {tmp}/no does not exist"),
])
def test_launch_benchmark_bad_input_is_one_line_exit_2(argv, message, tmp_path, capsys):
    # before: a traceback for an unknown --init, a zero size or T past the context, and --json
    # opened only after the whole measurement
    from llmcupy import launchbench

    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    try:
        rc = launchbench.main(argv)
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2 and message.replace("{tmp}", str(tmp_path)) in err and "Traceback" not in err, err
    assert not list(tmp_path.iterdir())


def test_launch_benchmark_cli_writes_its_json(tmp_path, capsys):
    from llmcupy import launchbench

    path = tmp_path / "launch.json"
    assert launchbench.main(["--backend", "sim", "--init", "d1", "-t", "4", "--repeats", "1", "--json", str(path)]) == 0
    r = json.loads(path.read_text())
    assert r["model"] == "d1" and r["planned"]["us_per_op_call"] > 0 and "us/launch" in capsys.readouterr().out
    # host microseconds depend on the machine and the commit: before, the record named neither
    from llmcupy import bench

    assert r["schema"] == "llmcupy.launchbench/1" and r["backend"] == "sim" and r["device"] and r["host"]
    assert r["command"] == f"python -m llmcupy.launchbench --backend sim --init d1 -t 4 --repeats 1 --json {path}"
    assert r["date"].endswith("Z") and r["git"] == bench.git_commit() and r["software"]["python"]


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
        (plan,) = op._plans.values()
        assert plan.launches is not None      # matmul_forward 5 is kernels_only: its launch is replayed as recorded
        replayed = cupy.asnumpy(op.run(5, dict(arrays))["out"])
        np.testing.assert_array_equal(checked, replayed)
        # an in-place op given out= (classifier_fused's dlogits over the logits), replayed on the GPU
        cf = llmcupy.ops["classifier_fused"]
        c = cf.make_inputs(np.random.default_rng(1), B=2, T=3, V=1001, P=1024)
        results = []
        for _ in range(3):
            arrays = {k: (cupy.asarray(v) if isinstance(v, np.ndarray) else v) for k, v in c.items()}
            out = {"losses": cupy.full(c["targets"].shape, np.nan, np.float32), "dlogits": arrays["logits"]}
            got = cf.run(None, arrays, out=out)
            results.append([cupy.asnumpy(got[k]) for k in cf.outputs])
        assert next(iter(cf._plans.values())).launches is not None
        for r in results[1:]:
            for x, y in zip(results[0], r):
                np.testing.assert_array_equal(x, y)
        from llmcupy import launchbench

        r = launchbench.measure(init="d1", B=1, T=4, repeats=2)
        assert r["planned"]["us_per_op_call"] > 0
    finally:
        llmcupy.set_backend("sim")


@pytest.mark.gpu
def test_slices_and_workspace_scratch_replay_on_a_gpu():
    # What the emulator cannot show: a plan finds q, k, v = qkvr[j] through CuPy's own view attributes
    # (.base, .strides, .data.ptr; CuPy leaves every slice of an empty array at its base's address),
    # and global_norm 4's partials come from the workspace inside a real stream capture.
    import cupy

    llmcupy.set_backend("cuda")
    try:
        op = llmcupy.ops["attention_forward"]
        a = op.make_inputs(np.random.default_rng(0), B=2, T=64, C=64, NH=2)
        results = []
        for _ in range(3):   # checked (records), then two replays
            got = op.run(2, {"inp": cupy.asarray(a["inp"]), "NH": a["NH"]})
            results.append({k: cupy.asnumpy(v) for k, v in got.items()})
        (plan,) = [p for key, p in op._plans.items() if key[0] == "cuda" and p.version.number == 2]
        assert plan.launches is not None
        assert sorted(view[3] for t in plan.launches for view in t[7]) == [0, 0, 0, 1, 1, 1, 2, 2]
        for r in results:
            for check in _op.check_outputs(op, op.reference_fn(**a), r, inputs=a):
                assert check["ok"], check

        gn = llmcupy.ops["global_norm"]
        data = cupy.asarray(gn.make_inputs(np.random.default_rng(1), count=50_001)["data"])
        eager = cupy.asnumpy(gn.run(4, {"data": data})["out"])
        workspace, out = _op.Workspace(), cupy.zeros(1, np.float32)
        with _op.graph_safe(workspace):
            gn.run(4, {"data": data}, out={"out": out})   # the warm-up: the partials are allocated here
        workspace.sealed = True
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream, _op.graph_safe(workspace):
            stream.begin_capture(cupy.cuda.runtime.streamCaptureModeThreadLocal)
            try:
                gn.run(4, {"data": data}, out={"out": out})   # a replayed plan, scratch from the workspace
            finally:
                graph = stream.end_capture()
            out.fill(np.nan)
            graph.launch(stream)
            stream.synchronize()
        assert len(workspace) == 1
        np.testing.assert_array_equal(cupy.asnumpy(out), eager)   # version 4 is deterministic
    finally:
        llmcupy.set_backend("sim")


# -- recorded launches: a kernels_only version's plan replays the checked call's launches ---------

def _kernels_only_cases():
    cases = []
    for name in sorted(llmcupy.ops):
        op = llmcupy.ops[name]
        for n, v in sorted(op.versions.items()):
            if v.kernels_only and v.available:
                cases.append((name, n))
    return cases


def _spy_launches(monkeypatch):
    """Every kernel launch the emulator receives: (kernel, grid, block, arguments, shared memory)."""
    seen = []
    real = rt._sim_launch

    def spy(entry, name, grid3, block3, args, shared_mem, stack_bytes, cooperative=False):
        seen.append((name, grid3, block3, list(args), shared_mem))
        return real(entry, name, grid3, block3, args, shared_mem, stack_bytes, cooperative)

    monkeypatch.setattr(rt, "_sim_launch", spy)
    return seen


def _by_name(launches, arrays: dict, outputs: dict):
    """Launches with each array argument replaced by the name(s) it has in the call, scalars by type and bytes."""
    named = []
    for kernel, grid3, block3, args, shared_mem in launches:
        norm = []
        for a in args:
            if isinstance(a, np.ndarray):
                names = sorted({f"in:{k}" for k, x in arrays.items() if x is a}
                               | {f"out:{k}" for k, x in outputs.items() if x is a})
                if not names:   # q, k and v of a qkvr buffer: x[j] of one of the call's arrays
                    names = sorted({f"{where}:{k}[{j}]" for where, d in (("in", arrays), ("out", outputs))
                                    for k, x in d.items() if isinstance(x, np.ndarray) and x.ndim >= 1
                                    and a.shape == x.shape[1:] for j in range(x.shape[0])
                                    if a.ctypes.data == x[j].ctypes.data})
                # none of the call's arrays: a scratch buffer of the launcher, known by shape and dtype
                norm.append(tuple(names) if names else ("scratch", a.shape, a.dtype.str))
            elif a is None:
                norm.append(None)
            else:
                norm.append((type(a), np.asarray(a).tobytes()))
        named.append((kernel, grid3, block3, tuple(norm), shared_mem))
    return named


def _inputs_for(op, v):
    rng = np.random.default_rng(3)
    for shape in op.test_shapes:
        a = op.make_inputs(rng, **shape)
        if v.requires is None or v.requires(a, v.default_block_size) is None:
            return a
    pytest.skip(f"{op.name} v{v.number}: no test shape it accepts")


def _copy(a):
    return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in a.items()}


def _poisoned_out(op, arrays):
    """out= for the outputs the op does not update in place, filled with NaN (a skipped write shows)."""
    out = {}
    for name, like in op.allocate_fn(np, arrays).items():
        if not any(like is x for x in arrays.values()):
            out[name] = np.full(like.shape, np.nan, like.dtype)
    return out


@pytest.mark.parametrize("op_name,number", _kernels_only_cases())
def test_a_replayed_launch_passes_the_checked_launch_arguments(op_name, number, monkeypatch, no_hazards):
    op = llmcupy.ops[op_name]
    v = op.versions[number]
    a = _inputs_for(op, v)
    seen = _spy_launches(monkeypatch)

    checked_in, checked_out = _copy(a), _poisoned_out(op, a)
    with _op.launch_plans(False):
        checked = op.run(number, checked_in, out=checked_out)
    checked_launches = _by_name(seen, checked_in, checked)
    assert checked_launches

    op.run(number, _copy(a), out=_poisoned_out(op, a))          # records the plan
    (plan,) = op._plans.values()
    assert plan.launches is not None, f"{op_name} v{number}: the plan did not record its launches"
    monkeypatch.setattr(v, "launch", lambda *args: pytest.fail("a replay ran the launcher"))

    del seen[:]
    replay_in, replay_out = _copy(a), _poisoned_out(op, a)
    replayed = op.run(number, replay_in, out=replay_out)
    assert _by_name(seen, replay_in, replayed) == checked_launches
    for name in op.outputs:
        assert (replayed[name] is replay_in.get(name)) == (checked[name] is checked_in.get(name))
        if v.deterministic:
            np.testing.assert_array_equal(replayed[name], checked[name], err_msg=f"{op_name} v{number} {name}")
    if not v.deterministic:
        # fp32 atomics add in another order each run, but host work the recording missed (zeroing an
        # accumulator) is far outside the op's tolerance
        for r in _op.check_outputs(op, checked, replayed, inputs=a):
            assert r["ok"], f"{op_name} v{number}: the replay's {r['name']} differs from the checked call's: {r}"


def test_a_plan_recorded_on_one_device_is_not_replayed_on_another(monkeypatch):
    # A launcher may size its grid or choose its kernel by the device (SM count, shared memory: see
    # layernorm_forward 6), and the checks of device limits ran on the device current then: another
    # current device (cupy.cuda.Device(1).use(), here a stand-in id) checks the call again
    from llmcupy.runtime import backend

    op = llmcupy.ops["layernorm_forward"]
    v = op.versions[3]
    a = _ln_inputs()
    monkeypatch.setattr(backend, "current_device", lambda: 0)
    first = op.run(3, _copy(a))
    ran = []
    launcher = v.launch
    monkeypatch.setattr(v, "launch", lambda arrays, bs: (ran.append(1), launcher(arrays, bs)))
    op.run(3, _copy(a))
    assert ran == [] and len(op._plans) == 1                # device 0 again: its plan replays
    monkeypatch.setattr(backend, "current_device", lambda: 1)
    again = op.run(3, _copy(a))
    assert ran == [1] and len(op._plans) == 2               # device 1: checked, and a plan of its own
    for name in op.outputs:
        np.testing.assert_array_equal(again[name], first[name])


def test_a_new_shape_or_dtype_records_a_new_plan_with_its_own_arguments(monkeypatch):
    op = llmcupy.ops["gelu_forward"]
    seen = _spy_launches(monkeypatch)
    x = np.linspace(-2, 2, 2 * 3 * 8, dtype=np.float32).reshape(2, 3, 8)
    op.run(2, {"inp": x})
    op.run(2, {"inp": x})
    assert _op.plans_cached() == 1
    y = np.linspace(-2, 2, 4 * 3 * 8, dtype=np.float32).reshape(4, 3, 8)   # twice the elements
    del seen[:]
    got = op.run(2, {"inp": y})["out"]
    assert _op.plans_cached() == 2
    (_, grid3, _, args, _), = seen
    assert args[-1] == np.int32(y.size) and grid3[0] >= 1
    np.testing.assert_allclose(got, op.reference(y), atol=1e-5)
    # a dtype the checks refuse: the same error as with plans off, and no plan for it
    with _op.launch_plans(False), pytest.raises(OpError) as off:
        op.run(2, {"inp": x.astype(np.float64)})
    with pytest.raises(OpError) as on:
        op.run(2, {"inp": x.astype(np.float64)})
    assert str(on.value) == str(off.value)
    assert _op.plans_cached() == 2


def test_a_wrong_scalar_type_is_refused_after_a_plan_was_recorded():
    op = llmcupy.ops["adamw"]
    a = op.make_inputs(np.random.default_rng(0), P=10)
    op.run(None, _copy(a))
    op.run(None, _copy(a))
    # t must be an integer step >= 1: a NumPy scalar's value is part of the key, not just its shape ()
    for bad_t in (np.float32(2.5), np.int32(0)):
        bad = dict(_copy(a), t=bad_t)
        with _op.launch_plans(False), pytest.raises(OpError) as off:
            op.run(None, _copy(bad))
        with pytest.raises(OpError) as on:
            op.run(None, _copy(bad))
        assert str(on.value) == str(off.value)


def test_a_scalar_input_is_part_of_the_plan_key():
    # adamw's step t changes the bias corrections the launch passes: never replayed with another t
    op = llmcupy.ops["adamw"]
    a = op.make_inputs(np.random.default_rng(0), P=10)
    op.run(None, _copy(a))
    b = dict(a, t=np.int32(int(a["t"]) + 1))
    want = op.reference(**b)
    got = op.run(None, _copy(b))
    assert _op.plans_cached() == 2
    for name, r in zip(op.outputs, want):
        np.testing.assert_allclose(got[name], r, rtol=1e-6, atol=1e-7)


def test_one_array_in_two_places_replays_only_while_it_is_one_array(monkeypatch):
    # residual in place (out is inp1): the recording holds while a call's inp1 and out are one
    # array; a call of the same shapes with a distinct out runs the launcher (checks still skipped)
    op = llmcupy.ops["residual_forward"]
    v = op.versions[2]
    z = np.full((1, 2, 8), 2.0, np.float32)
    x = np.ones((1, 2, 8), np.float32)
    op.run(2, {"inp1": x, "inp2": z}, out={"out": x})
    (plan,) = op._plans.values()
    assert plan.launches is not None and plan.same
    ran = []
    launcher = v.launch
    monkeypatch.setattr(v, "launch", lambda a, bs: (ran.append(1), launcher(a, bs)))
    x1 = np.ones((1, 2, 8), np.float32)
    op.run(2, {"inp1": x1, "inp2": z}, out={"out": x1})        # one array again: recorded launches
    assert ran == [] and (x1 == 3.0).all()
    x2, out2 = np.ones((1, 2, 8), np.float32), np.zeros((1, 2, 8), np.float32)
    op.run(2, {"inp1": x2, "inp2": z}, out={"out": out2})      # two arrays: the launcher decides
    assert ran == [1] and (out2 == 3.0).all() and (x2 == 1.0).all()


def test_a_replay_asks_for_the_launchers_scratch_again(monkeypatch):
    # layernorm_backward 10 zeroes a counter at the head of its scratch: a replay must do it too
    from llmcupy.ops import layernorm_backward as lnb

    op = llmcupy.ops["layernorm_backward"]
    a = op.make_inputs(np.random.default_rng(0), B=1, T=3, C=32)
    requests = []
    real = _op.scratch

    def spy(*args, **kwargs):
        requests.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(lnb, "scratch", spy)       # the launcher's own name for it (checked path)
    monkeypatch.setattr(_op, "scratch", spy)       # a replay's
    op.run(10, _copy(a))
    (plan,) = op._plans.values()
    assert plan.launches is not None and plan.scratch
    checked = list(requests)
    assert checked and checked[0][1].get("fill_count") == 32
    del requests[:]
    monkeypatch.setattr(op.versions[10], "launch", lambda *args: pytest.fail("a replay ran the launcher"))
    op.run(10, _copy(a))
    assert [(tuple(r[0][:3]),) for r in requests] == [(tuple(c[0][:3]),) for c in checked]
    (owner, name, shape, dtype, fill, fill_count), = plan.scratch
    assert (fill, fill_count) == (0.0, 32)


@pytest.mark.parametrize("number", [1, 2, 3, 4])
def test_every_global_norm_version_replays_its_launches_to_the_eager_bits(number, monkeypatch):
    # Versions 1-3 add into out[0] with atomics, so out must be zeroed first: that was a host-side
    # out.fill(0), which a plan cannot record, so their replays ran the launcher's Python. Zeroed by a
    # kernel, the plan replays it with the rest; out= starts as NaN and as the last call's result, so a
    # replay that skipped the zeroing shows. One worker in one thread order makes the atomics add in
    # the same order every run: the same bits.
    op = llmcupy.ops["global_norm"]
    a = op.make_inputs(np.random.default_rng(0), count=50_001)
    with sim.settings(order="forward", workers=1):
        with _op.launch_plans(False):
            eager = op.run(number, _copy(a), out={"out": np.full(1, np.nan, np.float32)})["out"]
        op.run(number, _copy(a), out={"out": np.full(1, np.nan, np.float32)})      # records the plan
        (plan,) = op._plans.values()
        assert plan.launches is not None, f"global_norm v{number}: its launches were not recorded"
        monkeypatch.setattr(op.versions[number], "launch", lambda *args: pytest.fail("a replay ran the launcher"))
        for start in (np.nan, float(eager[0])):
            replayed = op.run(number, _copy(a), out={"out": np.full(1, start, np.float32)})["out"]
            assert replayed.tobytes() == eager.tobytes(), f"v{number}, out={start}: {replayed} != {eager}"


def test_a_replayed_null_pointer_to_a_vector_type_is_not_given_an_address():
    # On cuda a checked launch prepares a None pointer as the 8-byte zero np.uint64(0), and a plan
    # replays that prepared tuple: the replay's alignment check of a float4* parameter asked
    # array_address for the zero's address (AttributeError: no 'ctypes') instead of passing it on
    mod = llmcupy.RawModule(code=r"""
    __global__ void add_bias(float* y, const float4* bias, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n && bias != nullptr) y[i] += reinterpret_cast<const float*>(bias)[i];
    }""", target="sim")
    kernel = mod.get_function("add_bias")
    y = np.zeros(4, np.float32)
    with rt.STUBBED:   # the replay's checks, without handing the cuda form of NULL to the emulator
        kernel._launch_replayed((1, 1, 1), (4, 1, 1), (y, np.uint64(0), np.int32(4)), 0)
        misaligned = np.zeros(8, np.float32)[1:5]   # an array's address is still checked
        with pytest.raises(llmcupy.KernelArgumentError, match="not 16-byte aligned"):
            kernel._launch_replayed((1, 1, 1), (4, 1, 1), (y, misaligned, np.int32(4)), 0)


def test_array_address_matches_numpy_for_every_kind_of_array():
    buf = np.zeros((6, 8), np.float32)
    readonly = buf[2]
    readonly.flags.writeable = False
    cases = [buf, buf[1], buf[1:, 3:], buf[:, 0], readonly, np.zeros(0, np.float32), buf.reshape(-1)[5:]]
    for a in cases:
        assert rt.array_address(a) == a.ctypes.data
        assert rt.array_address(a) == a.ctypes.data   # the cached answer too
    grown = np.zeros(4, np.float32)
    rt.array_address(grown)
    grown.resize(1 << 16)                                 # nothing holds on to it: NumPy may still resize it
    assert rt.array_address(grown) == grown.ctypes.data


def _unmarked_cases():
    cases = []
    for name in sorted(llmcupy.ops):
        op = llmcupy.ops[name]
        for n, v in sorted(op.versions.items()):
            if not v.kernels_only and v.available:
                cases.append((name, n))
    return cases


@pytest.mark.parametrize("op_name,number", _unmarked_cases())
def test_a_launcher_that_only_launches_kernels_is_marked(op_name, number, monkeypatch, no_hazards):
    # Record the unmarked launcher as if it were marked: when its launches are replayable (every
    # array argument one of the call's, or scratch) and a replay of them alone writes the checked
    # call's outputs, the launcher does nothing but launch kernels and lacks @kernels_only (its
    # replays then run its Python, and check it, for nothing). Host work the recording cannot see
    # (cuBLAS, a fill of an output, a copy) leaves the replay's outputs wrong, or no recording.
    op = llmcupy.ops[op_name]
    v = op.versions[number]
    a = _inputs_for(op, v)
    with _op.launch_plans(False):
        checked = op.run(number, _copy(a), out=_poisoned_out(op, a))
    monkeypatch.setattr(v, "kernels_only", True)
    op.run(number, _copy(a), out=_poisoned_out(op, a))
    (plan,) = op._plans.values()
    if plan.launches is None:
        return   # not replayable as recorded launches: the launcher must run on a replay
    monkeypatch.setattr(v, "launch", lambda *args: pytest.fail("a replay ran the launcher"))
    replayed = op.run(number, _copy(a), out=_poisoned_out(op, a))
    if v.deterministic:   # NaN where both leave an entry unwritten (trimat's upper triangle)
        same = all(np.array_equal(replayed[k], checked[k], equal_nan=True) for k in op.outputs)
    else:                 # fp32 atomics: the order of the additions varies from run to run
        same = all(r["ok"] for r in _op.check_outputs(op, checked, replayed, inputs=a))
    assert not same, (f"{op_name} v{number}: its launches replay to the checked result, so its launcher "
                      "only launches kernels: mark it @kernels_only (DEVELOPERS.md, adding a kernel version)")


def test_a_marked_launcher_that_calls_cublas_runs_its_launcher_on_a_replay(monkeypatch):
    # a plan records kernel launches only: a cuBLAS call inside a launcher wrongly marked
    # @kernels_only would be dropped from every replay, so the recording is given up instead
    from llmcupy.runtime import blas

    op = llmcupy.ops["matmul_forward"]
    v2, v5 = op.versions[2], op.versions[5]
    a = op.make_inputs(np.random.default_rng(0), B=1, T=4, C=8, OC=16)

    def kernel_then_gemm(arrays, bs):
        v5.launch(arrays, bs)       # out = inp @ weight^T + bias (a kernel)
        bt = 4
        blas.gemm(arrays["inp"].reshape(bt, 8), arrays["weight"], arrays["out"].reshape(bt, 16),
                  trans_b=True, beta=1.0)   # out += inp @ weight^T (cuBLAS)

    monkeypatch.setattr(v2, "launch", kernel_then_gemm)
    monkeypatch.setattr(v2, "kernels_only", True)
    monkeypatch.setattr(v2, "requires", v5.requires)
    with _op.launch_plans(False):
        checked = op.run(2, _copy(a))["out"]
    op.run(2, _copy(a))
    (plan,) = op._plans.values()
    assert plan.launches is None
    np.testing.assert_array_equal(op.run(2, _copy(a))["out"], checked)


def test_only_a_slice_along_the_first_axis_replays_as_a_view(monkeypatch):
    # qkvr[0], qkvr[1], qkvr[2] (the q, k, v blocks) replay as the new call's qkvr[j]; a view cut
    # any other way (here flat ranges of the same memory) is the launcher's own: it runs again
    op = llmcupy.ops["attention_permute"]
    v = op.versions[1]
    a = op.make_inputs(np.random.default_rng(0), B=2, T=3, C=8, NH=2)
    op.run(1, _copy(a))
    (plan,) = op._plans.values()
    assert [view[3] for view in plan.launches[0][7]] == [0, 1, 2]

    @_op.kernels_only
    def flat_views(arrays, bs):
        qkvr = arrays["qkvr"]
        flat, n = qkvr.reshape(-1), qkvr[0].size
        # the kernel reads q, k, v as flat float pointers: the same bytes as qkvr[0], [1], [2]
        kernel = _op.kernel_of("attention_permute", "attention_permute_kernel1")
        B, T, C3 = arrays["inp"].shape
        kernel(((n + bs - 1) // bs,), (bs,), (flat[:n], flat[n:2 * n], flat[2 * n:], arrays["inp"], np.int32(B),
                                             np.int32(T), np.int32(2), np.int32(C3 // 6)))

    monkeypatch.setattr(v, "launch", flat_views)
    _op.clear_plans()
    got = op.run(1, _copy(a))
    (plan,) = op._plans.values()
    assert plan.launches is None
    np.testing.assert_array_equal(got["qkvr"], op.reference(**a))


def test_a_slice_that_lies_in_two_overlapping_arrays_is_not_guessed(monkeypatch):
    # inp1 = buf[0:2] and out = buf[1:3] overlap: the launcher's out[0] is also inp1[1]. A recording
    # that took it for inp1[1] replays, on a call whose arrays do not overlap, into inp1 instead of
    # out; the recording is dropped instead and the launcher runs (views on both calls: one plan key)
    op = llmcupy.ops["residual_forward"]
    v = op.versions[1]
    kernel = _op.kernel_of("residual_forward", "residual_forward_kernel1")

    @_op.kernels_only
    def row_by_row(arrays, bs):
        out, inp1, inp2 = arrays["out"], arrays["inp1"], arrays["inp2"]
        for j in range(out.shape[0]):   # out[j] first: the ambiguous slice is the first array argument
            kernel((1,), (bs,), (out[j], inp1[j], inp2[j], np.int32(out[j].size)))

    monkeypatch.setattr(v, "launch", row_by_row)
    rows = np.arange(3 * 4 * 8, dtype=np.float32).reshape(3, 4, 8)
    buf, inp2 = rows.copy(), np.ones((2, 4, 8), np.float32)
    op.run(1, {"inp1": buf[0:2], "inp2": inp2}, out={"out": buf[1:3]})
    apart = np.full((5, 4, 8), np.nan, np.float32)
    apart[0:2] = rows[0:2]
    got = op.run(1, {"inp1": apart[0:2], "inp2": inp2}, out={"out": apart[3:5]})["out"]
    np.testing.assert_array_equal(apart[0:2], rows[0:2])   # the input is untouched
    np.testing.assert_array_equal(got, rows[0:2] + 1.0)
    (plan,) = op._plans.values()
    assert plan.launches is None


def test_a_leading_slice_is_found_by_its_memory_and_never_stands_for_a_scalar():
    x = np.zeros((3, 4), np.float32)
    assert _op._leading_index(x[2], x) == 2
    assert _op._leading_index(x.reshape(-1)[4:8], x) == 1      # the same memory as x[1]
    assert _op._leading_index(x.reshape(-1)[1:5], x) is None   # straddles two rows
    y = np.zeros(5, np.float32)
    # y[1] of a 1-D array is a NumPy scalar, not the 0-d array a launch was given
    assert _op._leading_index(y[1:2].reshape(()), y) is None


def test_a_size_past_a_kernels_int_argument_is_an_op_error_naming_the_version(monkeypatch):
    # a launcher passes np.int32(n); for n past 2^31 - 1 (an 8.6 GB float32 array, which a GPU holds)
    # NumPy raised a bare OverflowError naming no op. Stood in by a launcher given that n.
    op = llmcupy.ops["gelu_forward"]
    monkeypatch.setattr(op.versions[1], "launch", lambda a, bs: np.int32(2**31))
    inp = np.zeros(8, dtype=np.float32)
    with pytest.raises(OpError, match=r"gelu_forward version 1: a size does not fit its kernels' C int arguments "
                                      r"\(Python integer 2147483648 out of bounds for int32\); use smaller sizes"):
        op(inp, version=1)
