"""python -m llmcupy.profile: the per-op profile of a training step (emulator; one GPU-marked test)."""

import json
import re
import subprocess
import sys
import types

import numpy as np
import pytest

from llmcupy import profile
from llmcupy.config import GPT2Config, num_parameters
from llmcupy.data import write_tokens

B, T = 2, 64


def expected_calls(L: int) -> dict:
    """The launches of one training step, per op, as model.py makes them."""
    return {
        "encoder_forward": 1, "layernorm_forward": 2 * L + 1, "matmul_forward": 4 * L + 1,
        "attention_forward": L, "residual_forward": 2 * L, "gelu_forward": L, "classifier_fused": 1,
        "matmul_backward": 4 * L + 1, "matmul_backward_bias": 4 * L, "layernorm_backward": 2 * L + 1, "gelu_backward": L,
        "attention_backward": L, "encoder_backward": 1, "adamw": 1,
    }


@pytest.fixture(scope="module")
def emulator_run(tmp_path_factory):
    """One CLI run, as a user types it: d2, B=2, T=64, two profiled steps, --json."""
    d = tmp_path_factory.mktemp("profile")
    data = d / "train.bin"
    write_tokens(data, np.random.default_rng(0).integers(0, 50257, size=4 * B * T + 1))
    out = d / "profile.json"
    proc = subprocess.run([sys.executable, "-m", "llmcupy.profile", "--init", "d2", "-b", str(B), "-t", str(T),
                           "-i", str(data), "--steps", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, json.loads(out.read_text())


def test_table_is_printed_and_labelled_as_emulator_time(emulator_run):
    out, _ = emulator_run
    assert "CPU EMULATOR" in out and "NOT GPU times" in out
    assert re.search(r"^op +v phase +calls +emu ms +% emu +bytes +FLOPs$", out, re.M)
    for name in expected_calls(2):
        assert re.search(rf"^{name} +\d+ ", out, re.M), name
    assert "other (memsets, host)" in out
    assert "emulator step (CPU time, not a GPU's)" in out
    m = re.search(r"^launches per step: (\d+) kernel launches from (\d+) op calls", out, re.M)
    assert m and int(m.group(2)) == sum(expected_calls(2).values()) and int(m.group(1)) > 0
    for phase in profile.PHASES:
        assert re.search(rf"^  {phase} +[\d.]+ ms +[\d.]+%", out, re.M), phase


def test_percentages_add_up_to_100(emulator_run):
    out, report = emulator_run
    s = report["summary"]
    total = sum(r["pct"] for r in s["ops"]) + s["other_pct"]
    assert total == pytest.approx(100.0, abs=0.01)
    assert sum(p["pct"] for p in s["phases"]) == pytest.approx(100.0, abs=0.01)
    assert sum(p["ms"] for p in s["phases"]) == pytest.approx(report["step_ms"], rel=1e-6)
    step_line = re.search(r"^step +([\d.]+) +([\d.]+)%$", out, re.M)
    assert step_line and float(step_line.group(2)) == pytest.approx(100.0, abs=0.2)
    # sorted by time
    times = [r["ms"] for r in s["ops"]]
    assert times == sorted(times, reverse=True)


def test_json_has_every_op_of_the_step_with_calls_bytes_flops(emulator_run):
    _, report = emulator_run
    assert report["timing"] == "cpu-emulator-wall" and "NOT GPU times" in report["note"]
    assert report["steps"] == 2 and len(report["step_ms_each"]) == 2 and len(report["losses"]) == 2
    cfg = GPT2Config.preset("d2")
    L, C, Vp = cfg.num_layers, cfg.channels, cfg.padded_vocab_size
    rows = report["summary"]["ops"]
    calls = {}
    for r in rows:
        calls[r["op"]] = calls.get(r["op"], 0) + r["calls"]
        assert isinstance(r["calls"], int)  # per step, and both steps made the same launches
        assert r["ms"] > 0
        assert (r["bytes"] is None) != (r["flops"] is None), r  # memory-bound: bytes; GEMM-shaped: FLOPs
        assert (r["bytes"] or r["flops"]) > 0
        assert r["phase"] in profile.PHASES
    assert calls == expected_calls(L)
    by_key = {(r["op"], r["phase"]): r for r in rows}
    # the bounds are evaluated on the actual arrays of each launch
    assert by_key["gelu_forward", "forward blocks"]["bytes"] == L * 2 * B * T * 4 * C * 4
    assert by_key["matmul_forward", "classifier"]["flops"] == 2 * B * T * C * Vp
    assert by_key["adamw", "optimizer"]["bytes"] == 28 * num_parameters(cfg)
    phases = [p["phase"] for p in report["summary"]["phases"]]
    assert phases == list(profile.PHASES) + [profile.OTHER]
    ph = {p["phase"]: p for p in report["summary"]["phases"]}
    assert ph["forward blocks"]["calls"] == 10 * L
    assert ph["optimizer"]["bytes"] == by_key["adamw", "optimizer"]["bytes"]
    assert ph["classifier"]["flops"] == sum(r["flops"] or 0 for r in rows if r["phase"] == "classifier")


def test_json_says_when_where_and_how_it_was_measured(emulator_run):
    # before: device and backend only; a profile.json kept beside bench's records could not be
    # told apart from another commit's or reproduced
    import datetime

    _, report = emulator_run
    assert report["schema"] == "llmcupy.profile/1"
    when = datetime.datetime.fromisoformat(report["date"].replace("Z", "+00:00"))
    assert when.tzinfo is not None and abs((datetime.datetime.now(datetime.timezone.utc) - when).days) < 1
    assert report["command"].startswith("python -m llmcupy.profile --init d2 -b 2 -t 64 -i ")
    assert "--steps 2 --json " in report["command"] and report["command"].endswith("profile.json")
    assert set(report["git"]) == {"commit", "dirty"} and report["git"]["commit"]
    assert report["device"] and report["software"]["numpy"] == np.__version__


def test_random_data_in_process(capsys):
    rc = profile.main(["--init", "d2", "-b", "1", "-t", "8", "--random-data", "--warmup", "0"])
    out = capsys.readouterr().out
    assert rc == 0 and "random tokens" in out and "mean of 1 profiled step(s) after 0 warm-up" in out


def test_errors(capsys, tmp_path):
    rc = profile.main(["--init", "d2", "-b", "1", "-t", "8", "--steps", "0", "--random-data"])
    assert rc == 2 and "--steps must be >= 1" in capsys.readouterr().err
    rc = profile.main(["--init", "d2", "-b", "1", "-t", "8", "-i", str(tmp_path / "none*.bin")])
    assert rc == 2 and "no token files match" in capsys.readouterr().err
    # a negative seed was NumPy's traceback; an unwritable --json one after the whole profile had run
    rc = profile.main(["--init", "d2", "-b", "1", "-t", "8", "--random-data", "--seed", "-1"])
    assert rc == 2 and "--seed must be >= 0 (got -1)" in capsys.readouterr().err
    # the trainer's flags the profile cannot honour were ignored: --resume profiled gpt2_124M.bin instead
    rc = profile.main(["--init", "d2", "-b", "1", "-t", "8", "--random-data", "--resume", str(tmp_path / "s.npz")])
    assert rc == 2 and "--resume is the trainer's; the profile does not use it (-e takes" in capsys.readouterr().err
    rc = profile.main(["--init", "d2", "-b", "1", "-t", "8", "--random-data", "-o", str(tmp_path / "log")])
    assert rc == 2 and "-o is the trainer's" in capsys.readouterr().err
    for where, why in ((tmp_path, "it is a folder"), (tmp_path / "f" / "p.json", "does not exist")):
        rc = profile.main(["--init", "d2", "-b", "1", "-t", "8", "--random-data", "--json", str(where)])
        captured = capsys.readouterr()
        assert rc == 2 and f"--json {where}: " in captured.err and why in captured.err, captured.err
        assert "profiling" not in captured.out
    with pytest.raises(SystemExit):  # train's flags are parsed strictly
        profile.build_parser().parse_args(["--no-such-flag"])
    p = profile.build_parser().parse_args([])
    assert (p.steps, p.warmup, p.json) == (1, 1, None)


def test_json_on_a_device_is_refused_before_the_run(capsys):
    # --json /dev/null passed the start-up check, then the whole profile ran and the atomic write
    # refused to rename over the device: a FileExistsError traceback, exit 1
    rc = profile.main(["--init", "d2", "-b", "1", "-t", "8", "--random-data", "--json", "/dev/null"])
    captured = capsys.readouterr()
    assert rc == 2 and "--json /dev/null: it exists and is not a regular file" in captured.err, captured.err
    assert "profiling" not in captured.out


def test_help_describes_the_profile_not_the_trainer():
    # the trainer's flags come with the trainer's help: --benchmark promised "--steps steps (default 10)"
    text = " ".join(profile.build_parser().format_help().split())
    assert "(default 10)" not in text
    assert "--benchmark implied: the profile always runs one fixed batch" in text


def test_output_piped_into_head_ends_quietly():
    # `python -m llmcupy.profile ... | head -1`: the table met the closed pipe, a BrokenPipeError traceback
    proc = subprocess.Popen([sys.executable, "-m", "llmcupy.profile", "--init", "d1", "-b", "1", "-t", "8",
                             "--random-data", "--backend", "sim"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("profiling random init d1")
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 141 and err == "", err


def test_token_ids_outside_the_vocabulary_are_refused_naming_the_file(capsys, tmp_path):
    # as the trainer does: every token file is scanned, before the model is allocated. An id past the
    # first batch is caught too (the model's own check would only ever see the batch it is given).
    tokens = np.zeros(4 * 8 + 1, dtype=np.int64)
    tokens[-1] = 65000
    write_tokens(tmp_path / "allbad.bin", tokens)
    rc = profile.main(["--init", "d2", "-b", "1", "-t", "8", "-i", str(tmp_path / "allbad.bin")])
    captured = capsys.readouterr()
    assert rc == 2, captured.out
    assert "allbad.bin: token id 65000" in captured.err and "outside the model's vocabulary" in captured.err
    assert "profiling" not in captured.out


def test_gpu_summary_relates_to_the_bounds():
    """The GPU arithmetic (GB/s, TFLOP/s, fraction of bound) on made-up records, no device needed."""
    recs = [
        {"op": "gelu_forward", "version": 2, "block_size": 128, "phase": "forward blocks", "kind": "memory",
         "bytes": 2_000_000_000, "flops": None, "ms": 1.0},
        {"op": "gelu_forward", "version": 2, "block_size": 128, "phase": "forward blocks", "kind": "memory",
         "bytes": 2_000_000_000, "flops": None, "ms": 3.0},
        {"op": "matmul_forward", "version": 2, "block_size": 256, "phase": "classifier", "kind": "flops",
         "bytes": None, "flops": 10 ** 11, "ms": 5.0},
    ]
    bounds = {"copy_gbs": 2000.0, "cublas": {"tflops": 40.0, "gemm": "(8 x 8) @ (8 x 32)"}}
    s = profile.summarize(recs, steps=1, step_ms=10.0, bounds=bounds, gpu=True)
    gelu, mm = sorted(s["ops"], key=lambda r: r["op"])
    assert gelu["calls"] == 2 and gelu["ms"] == 4.0 and gelu["gbs"] == pytest.approx(1000.0)
    assert gelu["fraction_of_bound"] == pytest.approx(0.5)
    assert mm["tflops"] == pytest.approx(20.0) and mm["fraction_of_bound"] == pytest.approx(0.5)
    assert s["other_ms"] == pytest.approx(1.0) and s["other_pct"] == pytest.approx(10.0)
    report = {"timing": "gpu-events", "summary": s, "step_ms": 10.0, "bounds": bounds, "tf32": True, "steps": 1,
              "warmup": 1, "B": 4, "T": 64, "tokens_per_s": 25600.0, "unprofiled_step_ms": 9.5, "notes": []}
    import io
    import contextlib

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        profile.print_report(report)
    text = buf.getvalue()
    assert "CUDA events" in text and "cuBLAS" in text
    assert re.search(r"^gelu_forward +2 forward blocks +2 +4\.000 +40\.0% +1000\.0 GB/s +50%$", text, re.M)
    assert re.search(r"^matmul_forward +2 classifier +1 +5\.000 +50\.0% +20\.00 TFLOP/s +50%$", text, re.M)
    assert "GPU step: 10.000 ms" in text


def test_gpu_recorder_uses_events_around_each_launch(monkeypatch):
    """The hook records an event before and after the launch and reads the elapsed time after a sync."""
    log = []

    class Event:
        def __init__(self):
            self.t = None

        def record(self):
            self.t = len(log)
            log.append("record")

    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(Event=Event, get_elapsed_time=lambda a, b: float(b.t - a.t))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    import llmcupy

    op = llmcupy.ops["gelu_forward"]
    rec = profile.Recorder(gpu=True)
    arrays = {"inp": np.zeros(16, np.float32), "out": np.zeros(16, np.float32)}
    with rec(op, 2, 128, arrays):
        log.append("launch")
        with rec(op, 2, 128, arrays):  # a launch inside another op's belongs to the outer one
            log.append("inner")
    assert log == ["record", "launch", "inner", "record"]
    rec.resolve()
    assert len(rec.records) == 1
    r = rec.records[0]
    assert r["ms"] == 3.0 and r["bytes"] == 2 * 16 * 4 and "events" not in r


@pytest.mark.gpu
def test_profile_on_a_gpu_has_timings(tmp_path, capsys):
    import llmcupy

    path = tmp_path / "p.json"
    try:
        rc = profile.main(["--backend", "cuda", "--init", "d2", "-b", "4", "-t", "64", "--random-data",
                           "--steps", "2", "--json", str(path)])
    finally:
        llmcupy.set_backend("sim")
    out = capsys.readouterr().out
    assert rc == 0, out
    report = json.loads(path.read_text())
    assert report["timing"] == "gpu-events" and "CUDA events" in out
    assert report["bounds"]["copy_gbs"] > 0 and report["bounds"]["cublas"]["tflops"] > 0
    assert report["unprofiled_step_ms"] > 0
    s = report["summary"]
    assert {r["op"] for r in s["ops"]} == set(expected_calls(2))
    for r in s["ops"]:
        assert r["ms"] > 0, r
        assert ("gbs" in r) or ("tflops" in r), r
        assert r["fraction_of_bound"] > 0, r
    assert 0 < s["kernel_ms"] <= report["step_ms"]
    assert sum(r["pct"] for r in s["ops"]) + s["other_pct"] == pytest.approx(100.0, abs=0.01)
