"""The timing method (llmcupy.runtime.timing.measure) on the emulator's code path, and the cached
device attributes the launchers size grids from. On a GPU the same steps use CUDA events, a delay
kernel and an L2-sized memset (the ``gpu`` tests at the end)."""

import sys
import time
import types

import numpy as np
import pytest

from llmcupy.runtime import backend, timing

from _helpers import stand_in_checkout


@pytest.fixture
def cuda():
    """The cuda backend for one test, the emulator again after it (the suite's default)."""
    backend.set_backend("cuda")
    yield
    backend.set_backend("sim")


class LoggingClock(timing.HostClock):
    """The host clock, logging each step of the method in order."""

    def __init__(self):
        super().__init__()
        self.log = []

    def flush_l2(self):
        super().flush_l2()
        self.log.append("flush")

    def delay(self, ms):
        super().delay(ms)
        self.log.append("delay")

    def record(self):
        self.log.append("event")
        return super().record()


def test_each_sample_is_flush_delay_event_fn_event():
    clock = LoggingClock()
    calls = []

    def fn():
        calls.append(1)
        clock.log.append("fn")

    r = timing.measure(fn, clock, repeat=4, warmup=2)
    assert len(calls) == 2 + 4
    assert clock.log[:2] == ["fn", "fn"]  # warm-up: no events
    assert clock.log[2:] == ["flush", "delay", "event", "fn", "event"] * 4
    assert r["repeat"] == 4 and r["l2_flushed"] and r["retried"] == 0
    assert r["min_ms"] <= r["mean_ms"] <= r["max_ms"]
    assert "not GPU time" in r["timing"]


def test_no_flush_when_asked():
    clock = LoggingClock()
    timing.measure(lambda: None, clock, repeat=3, warmup=1, flush_l2=False)
    assert "flush" not in clock.log and clock.flushes == 0


def test_delay_covers_twice_the_host_dispatch_time():
    # fn takes ~2 ms of host time to "dispatch": the spin queued before the start event must be
    # longer, so that the GPU is still busy when the launch arrives
    clock = timing.HostClock()

    def fn():
        time.sleep(0.002)

    r = timing.measure(fn, clock, repeat=2, warmup=2)
    assert r["host_dispatch_ms"] >= 2.0
    assert clock.delays[0] >= 2 * r["host_dispatch_ms"] + timing.MIN_DELAY_MS - 1e-9
    assert r["min_ms"] >= 2.0  # the window holds fn (host clock: its sleep)


def test_a_sample_whose_enqueue_outlasts_the_delay_is_measured_again():
    # the warm-up is fast, then one sample's dispatch is slow: that sample is redone with a longer spin
    clock = timing.HostClock()
    state = {"n": 0}

    def fn():
        state["n"] += 1
        if state["n"] == 4:  # the first timed sample after 3 warm-ups
            time.sleep(0.01)

    r = timing.measure(fn, clock, repeat=3, warmup=3)
    assert r["retried"] == 1
    assert state["n"] == 3 + 3 + 1
    assert clock.delays[1] > clock.delays[0] and clock.delays[1] >= 2 * 10.0 * 0.9
    assert r["max_ms"] < 10.0  # the slow attempt was discarded, not averaged in


def test_benchmark_refuses_the_emulator():
    with pytest.raises(timing.NoGPUTiming, match="does not model GPU time"):
        timing.benchmark_ms(lambda: None)


def test_device_attributes_are_queried_once(monkeypatch):
    # launchers ask for the SM count etc. on every launch; the device is asked once per attribute
    queries = []

    def get_attribute(attr, dev):
        queries.append((attr, dev))
        return {1: 132, 2: 2048, 3: 232448}[attr]

    runtime = types.SimpleNamespace(deviceGetAttribute=get_attribute, cudaDevAttrMultiProcessorCount=1,
                                    cudaDevAttrMaxThreadsPerMultiProcessor=2,
                                    cudaDevAttrMaxSharedMemoryPerBlockOptin=3)
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime, Device=lambda: types.SimpleNamespace(id=0)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(backend, "get_backend", lambda: "cuda")
    monkeypatch.setattr(backend, "_ATTRIBUTES", {})
    from llmcupy.ops import fused_residual_forward, layernorm_backward, matmul_backward_bias

    for _ in range(5):
        assert matmul_backward_bias._resident_threads("cuda") == 132 * 2048
        assert layernorm_backward._num_sms() == 132
    assert sorted(queries) == [(1, 0), (2, 0)]
    with monkeypatch.context() as m:
        m.setattr(backend, "is_sim", lambda: False)
        assert fused_residual_forward._device_limits() == (132 * 2048, 232448)
    assert len(queries) == 3


@pytest.mark.gpu
def test_gpu_timing_excludes_host_dispatch(cuda):
    # a launch preceded by 2 ms of host work: the delay kernel keeps the GPU busy meanwhile, so the
    # measured window is the tiny kernel alone, far below the host time
    import cupy

    x = cupy.zeros(1024, cupy.float32)

    def fn():
        time.sleep(0.002)
        x.fill(1)

    r = timing.benchmark_ms(fn, repeat=5)
    assert r["host_dispatch_ms"] >= 2.0 and r["max_ms"] < 1.0, r


@pytest.mark.gpu
def test_gpu_copy_bound_is_the_best_of_memcpy_and_a_copy_kernel(cuda):
    c = timing.copy_bandwidth(1 << 26)
    assert set(c["all_gbs"]) == {"cudaMemcpyAsync", "float4 copy kernel"}
    assert c["gbs"] == max(c["all_gbs"].values()) and c["method"] in c["all_gbs"]


@pytest.mark.parametrize("version, warned", [("14.0.1", True), ("13.6.0", True), ("14.2.0", False), ("15.0.0a1", False)])
def test_old_cupy_is_named_once(monkeypatch, capsys, version, warned):
    # before 14.2 CuPy's disk cache skips modules with name expressions: every start recompiles
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(__version__=version))
    monkeypatch.setattr(backend, "_cupy_checked", False)
    backend._check_cupy_version()
    backend._check_cupy_version()
    err = capsys.readouterr().err
    assert err.count("install cupy>=14.2") == (1 if warned else 0)


def test_startup_runs_cold_then_warm_with_the_same_fresh_caches(tmp_path, monkeypatch, capsys):
    import json
    import os

    from llmcupy import startup

    seen = []

    def run(argv, env):
        seen.append((argv, env["CUPY_CACHE_DIR"], env["LLMCUPY_CACHE_DIR"], os.path.exists(env["CUPY_CACHE_DIR"])))
        os.makedirs(env["CUPY_CACHE_DIR"], exist_ok=True)  # what a run's compiles do
        return {"seconds": 5.0 if len(seen) == 1 else 1.5, "returncode": 0, "tail": ""}

    result = startup.measure(["--init", "d2", "-b", "1"], run=run)
    (argv1, cupy1, sim1, existed1), (argv2, cupy2, sim2, existed2) = seen
    assert argv1 == argv2 and argv1[1:3] == ["-m", "llmcupy.train"] and "--benchmark" in argv1
    assert argv1[-4:] == ["--init", "d2", "-b", "1"]
    assert (cupy1, sim1) == (cupy2, sim2) and not existed1 and existed2  # cold: empty; warm: the cold run's
    assert not os.path.exists(cupy1)  # the temporary caches are removed afterwards
    assert result["cold"]["seconds"] == 5.0 and result["warm"]["seconds"] == 1.5

    monkeypatch.setattr(startup, "measure", lambda flags: result)
    assert startup.main(["--out", str(tmp_path), "--init", "d2"]) == 0
    record = json.loads(next(tmp_path.glob("startup-*.json")).read_text())
    assert record["compile_seconds"] == 3.5 and record["backend"] == "sim" and "not a GPU" in record["note"]
    assert "cold start: 5.00 s" in capsys.readouterr().out


def test_startup_keeps_emulator_records_out_of_the_gpu_results(tmp_path, monkeypatch, capsys):
    # bench/results holds GPU evidence, committed; emulator runs of bench go to the git-ignored
    # bench/results/sim. Before, startup's emulator record (CPU times of g++ builds) landed beside the
    # GPU runs, and an --out naming a file was a FileExistsError traceback after both runs.
    from llmcupy import startup

    result = {"command": "-m llmcupy.train", "cold": {"seconds": 5.0, "returncode": 0, "tail": ""},
              "warm": {"seconds": 1.5, "returncode": 0, "tail": ""}}

    runs = []
    monkeypatch.setattr(startup, "measure", lambda flags: runs.append(flags) or result)
    # the checkout's bench/results/sim from any working folder, as bench's runs: before, a run from
    # another folder wrote the record under that folder, where --list-results never looked
    checkout, elsewhere = tmp_path / "checkout", tmp_path / "elsewhere"
    stand_in_checkout(monkeypatch, checkout)
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert startup.main(["--init", "d2"]) == 0
    written = [p.relative_to(tmp_path) for p in tmp_path.rglob("startup-*.json")]
    assert [p.parent.as_posix() for p in written] == ["checkout/bench/results/sim"]
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / written[0]}" in out   # named in full: it is not under the working folder
    monkeypatch.chdir(checkout)
    assert startup.main(["--init", "d2"]) == 0
    out = capsys.readouterr().out
    assert "wrote bench/results/sim/startup-" in out
    # the console said "cold start: 5.00 s" as if it were a GPU's start; only the file said otherwise
    assert "note: CPU emulator: g++ builds and emulated steps, not a GPU's start time" in out
    (checkout / "afile").write_text("")
    assert startup.main(["--out", "afile", "--init", "d2"]) == 2
    assert capsys.readouterr().err.strip() == "error: --out afile is a file; give a folder"
    assert len(runs) == 2   # refused before the runs


def test_startup_refuses_bad_trainer_flags_once_and_records_no_failed_run(tmp_path, monkeypatch, capsys):
    from llmcupy import startup

    runs = []

    def failing(argv, env):
        runs.append(argv)
        return {"seconds": 0.5, "returncode": 2, "tail": "error: no model file 'gpt2_124M.bin'"}

    monkeypatch.setattr(startup, "_run", failing)
    # a flag the trainer does not have: refused here, once, before any run
    assert startup.main(["--out", str(tmp_path), "--bogus-flag"]) == 2
    err = capsys.readouterr().err
    assert err.count("usage:") == 1 and "unrecognized arguments: --bogus-flag" in err, err
    assert runs == []
    # a failure only the trainer finds: one run (no warm run after a failed cold one), its exit code
    assert startup.main(["--out", str(tmp_path), "-b", "1"]) == 2
    err = capsys.readouterr().err
    assert len(runs) == 1 and "no model file" in err and "nothing recorded" in err, err
    assert not list(tmp_path.iterdir())


def test_profiler_events_bracket_the_launches_only(monkeypatch):
    # the start event is recorded at the op's first kernel/cuBLAS launch, the end event after its
    # last, so host work before the first launch (argument checks, grid sizing) is not the op's
    import llmcupy
    from llmcupy import profile

    order = []

    class Event:
        def __init__(self):
            self.at = None

        def record(self):
            order.append(self)
            self.at = len(order)

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=Event))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    rec = profile.Recorder(gpu=True)
    op = llmcupy.ops["gelu_forward"]
    arrays = {"inp": np.zeros((2, 4), np.float32), "out": np.zeros((2, 4), np.float32)}
    with rec(op, 1, 128, arrays):
        order.append("host work")             # Python dispatch before the first launch
        rec.before(); order.append("kernel 1"); rec.after()
        with rec(op, 1, 128, arrays):         # a nested op's launches belong to the outer op
            rec.before(); order.append("kernel 2"); rec.after()
        order.append("host work after")
    (r,) = rec.records
    start, end = r["events"]  # .at: the position of an event's last record in `order` (1-based)
    assert order[start.at] == "kernel 1" and order[end.at - 2] == "kernel 2"
    with rec(op, 1, 128, arrays):             # no launch observed (CuPy calls only): the whole op
        order.append("cupy work")
    start, end = rec.records[-1]["events"]
    assert start.at - 1 < order.index("cupy work") < end.at - 1


def test_the_first_warmup_call_never_sets_the_delay():
    # the first call of fn may compile its kernel (copy_bandwidth's copy kernel, with warmup=2): its
    # time is not the dispatch cost, and taking it would spin every sample for up to MAX_DELAY_MS
    clock = timing.HostClock()
    calls = []

    def fn():
        calls.append(None)
        time.sleep(0.1 if len(calls) == 1 else 0.001)

    r = timing.measure(fn, clock, repeat=2, warmup=2)
    assert r["host_dispatch_ms"] < 50, r
    assert max(clock.delays) < 100, clock.delays
    r = timing.measure(lambda: time.sleep(0.002), timing.HostClock(), repeat=1, warmup=1)
    assert r["host_dispatch_ms"] >= 2.0  # a single warm-up call is all there is to go by


def sum_ok(r, budget):
    # stopped by the budget: the samples taken reach it (each at least the 30 ms slept)
    return r["repeat"] * r["mean_ms"] >= budget


def test_samples_stop_at_the_time_budget_but_never_below_the_minimum():
    # a slow kernel (here 30 ms of host clock per sample) takes MIN_SAMPLES and then stops once the
    # samples add up to the budget, instead of all 50 a fast kernel gets
    def slow():
        time.sleep(0.03)

    r = timing.measure(slow, timing.HostClock(), repeat=50, warmup=1, budget_ms=100.0)
    assert r["repeat"] == timing.MIN_SAMPLES and r["repeat_asked"] == 50, r
    r = timing.measure(slow, timing.HostClock(), repeat=8, warmup=1, budget_ms=200.0)
    assert 5 <= r["repeat"] < 8 and sum_ok(r, 200.0), r
    r = timing.measure(lambda: None, timing.HostClock(), repeat=20, warmup=1, budget_ms=100.0)
    assert r["repeat"] == 20  # a fast fn never reaches the budget
    r = timing.measure(slow, timing.HostClock(), repeat=7, warmup=1, budget_ms=None)
    assert r["repeat"] == 7


def test_a_cublas_bound_says_whether_it_ran_with_tf32(monkeypatch):
    # a trainer-shapes run measures cuBLAS with TF32 on (the trainer's setting): before, the record and
    # bench's line said "of cuBLAS" alone, as if a hand-written FP32 kernel were held to FP32 cuBLAS
    import llmcupy
    from llmcupy import bench, harness
    from llmcupy.runtime import blas

    op = llmcupy.ops["matmul_forward"]
    inputs = op.make_inputs(np.random.default_rng(0), **op.sim_sizes)
    monkeypatch.setattr(timing, "benchmark_ms", lambda fn, repeat=20: {"mean_ms": 2.0})   # no GPU here
    for enabled in (True, False):
        monkeypatch.setattr(blas, "_TF32", [enabled])
        bound = harness._bound(op, inputs, repeat=3)
        assert bound["kind"] == "flops" and bound["cublas_ms"] == 2.0 and bound["tf32"] is enabled
        assert bench._bound_name(bound) == f"cuBLAS's speed{' with TF32' if enabled else ''} (2.0000 ms)"


def test_a_tf32_kernels_cublas_bound_is_measured_with_tf32(monkeypatch):
    # matmul_forward_tf32 computes on TF32 tensor cores, but a catalogue or bench sweep (TF32 off, the
    # FP32 ops' setting) timed its cuBLAS bound as plain FP32 SGEMM, several times slower on an H100:
    # its fraction of the bound compared two precisions. Its bound now runs cuBLAS with TF32 on, and
    # says so; an FP32 op's bound still follows the run's setting.
    import llmcupy
    from llmcupy import harness
    from llmcupy.runtime import blas

    seen = []

    def fake_benchmark(fn, repeat=20):   # no GPU here: run the baseline once, note the TF32 setting
        fn()
        seen.append(blas.tf32_enabled())
        return {"mean_ms": 2.0}

    monkeypatch.setattr(timing, "benchmark_ms", fake_benchmark)
    monkeypatch.setattr(blas, "_tf32_capable", lambda: True)   # as on an sm_80+ GPU
    for name, tf32 in (("matmul_forward_tf32", True), ("matmul_forward", False)):
        op = llmcupy.ops[name]
        inputs = op.make_inputs(np.random.default_rng(0), **op.sim_sizes)
        seen.clear()
        bound = harness._bound(op, inputs, repeat=3)
        assert seen == [tf32] and bound["tf32"] is tf32, (name, seen, bound)
        assert not blas.tf32_enabled()   # restored after the bound


def test_startup_record_has_the_provenance_of_the_other_records(tmp_path, monkeypatch):
    # bench sweeps, profile --json, kernel --json and launchbench --json all stamp `date` (UTC, "Z"),
    # `command` (as typed), `git` {commit, dirty} and `software`. The start-up record had `versions`,
    # commit/dirty at the top level, a "+00:00" date and the trainer's command in place of its own, so
    # one reader could not take the provenance of every record in bench/results the same way.
    import json
    import re

    from llmcupy import bench, startup

    result = {"command": "python -m llmcupy.train --benchmark --init d2",
              "cold": {"seconds": 5.0, "returncode": 0, "tail": ""},
              "warm": {"seconds": 1.5, "returncode": 0, "tail": ""}}
    monkeypatch.setattr(startup, "measure", lambda flags: result)
    assert startup.main(["--out", str(tmp_path), "--init", "d2"]) == 0
    path = next(tmp_path.glob("startup-*.json"))
    record = json.loads(path.read_text())
    assert record["schema"] == "llmcupy.startup/1"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["date"]), record["date"]
    assert record["command"] == "python -m llmcupy.startup --out " + str(tmp_path) + " --init d2"
    assert record["train_command"] == result["command"]
    assert set(record["git"]) == {"commit", "dirty"}
    assert {"python", "numpy"} <= set(record["software"])
    assert not {"versions", "commit", "dirty"} & set(record), sorted(record)
    assert record["host"] and record["backend"] == "sim" and record["device"]
    # the readers of the results folder name it by its schema, date and device
    with pytest.raises(bench.OtherRecord) as refused:
        bench.load(path)
    assert refused.value.schema == "llmcupy.startup/1"
    assert (f"a llmcupy.startup/1 record ({record['date']} {record['device']}), not a benchmark run"
            in bench.list_results(tmp_path))
