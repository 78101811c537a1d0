"""python -m llmcupy.bench: a run in the emulator, its JSON record and plot, plots and compare of GPU records.

The GPU records here are synthetic (hand-written numbers in the shape the bench writes on a GPU), so
that plotting and `compare` are tested without a device.
"""

import copy
import datetime
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import llmcupy
from llmcupy import bench

from _helpers import stand_in_checkout

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                                      reason="plots need matplotlib (pip install matplotlib)")


def run(*args, timeout=600, cwd=None):
    proc = subprocess.run([sys.executable, "-m", "llmcupy.bench", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)
    return proc.returncode, proc.stdout, proc.stderr


def assert_png(path, min_bytes=10_000):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert len(data) > min_bytes, f"{path} is only {len(data)} bytes"


# ----------------------------------------------------------------------------------------------
# synthetic GPU records


def _block(bs, ms, kind, ok=True, max_rel=3e-7):
    b = {"block_size": bs, "ok": ok, "errors": {"out": {"max_abs": max_rel, "max_rel": max_rel, "mismatches": 0 if ok else 7}}}
    if ok:
        b.update(ms=ms, min_ms=ms * 0.98, max_ms=ms * 1.04, repeat=50)
        if kind == "memory":
            b["gbs"] = 3.29e9 / (ms * 1e-3) / 1e9
            b["fraction_of_bound"] = b["gbs"] / 2900.0
        else:
            b["tflops"] = 2.0e12 / (ms * 1e-3) / 1e12
            b["fraction_of_bound"] = 4.0 / ms
    return b


def _version(op, n, kind, times, ok=True, fail_at=()):
    if kind == "memory":
        bound = {"kind": "memory", "bytes": 3_290_000_000, "copy_gbs": 2900.0}
        sizes = {"B": 8, "T": 1024, "V": 50257}
    else:
        bound = {"kind": "flops", "flops": 2_000_000_000_000, "cublas_ms": 4.0, "cublas_tflops": 500.0}
        sizes = {"B": 32, "T": 1024, "C": 768, "OC": 3072}
    blocks = [_block(bs, ms, kind, ok=bs not in fail_at) for bs, ms in times.items()]
    entry = {"op": op, "version": n, "summary": f"{op} version {n}", "default": n == 2, "ok": ok and not fail_at,
             "sizes": sizes, "bound": bound, "blocks": blocks}
    timed = [b for b in blocks if b.get("ms") is not None]
    if timed:
        best = min(timed, key=lambda b: b["ms"])
        entry["best"] = {k: best[k] for k in ("block_size", "ms", "gbs", "tflops", "fraction_of_bound") if k in best}
    return entry


def synthetic_gpu_record(speed=1.0, commit="1111111111111111111111111111111111111111", date="2025-01-01T12:00:00Z",
                         regress=False, fix=False):
    """A record as a GPU run writes it: softmax_forward (memory-bound) and matmul_forward (cuBLAS-bound)."""
    t = lambda *ms: dict(zip((32, 64, 128, 256, 512, 1024), (m * speed for m in ms)))  # noqa: E731
    results = [
        _version("softmax_forward", 1, "memory", t(9.0, 8.0, 8.5, 9.5, 10.0, 12.0)),
        _version("softmax_forward", 2, "memory", t(3.0, 2.0, 1.6, 1.5, 1.7, 2.2),
                 fail_at=(64,) if regress else ()),
        _version("softmax_forward", 3, "memory", t(1.4, 1.3, 1.25, 1.2, 1.3, 1.5),
                 fail_at=() if fix else (1024,)),
        _version("matmul_forward", 1, "flops", {8: 60.0 * speed, 16: 40.0 * speed, 32: 45.0 * speed}),
        _version("matmul_forward", 2, "flops", {8: 12.0 * speed, 16: 9.0 * speed, 32: 10.0 * speed}),
        {"op": "matmul_forward", "version": 3, "summary": "cuBLASLt", "default": False, "ok": None,
         "skipped": "unavailable: no cuBLASLt binding", "blocks": []},
    ]
    return {
        "schema": bench.SCHEMA, "date": date, "command": "python -m llmcupy.bench --ops softmax_forward matmul_forward",
        "backend": "cuda", "device": "NVIDIA H100 80GB HBM3",
        "software": {"python": "3.11.7", "numpy": "1.26.4", "cuda_runtime": 12040, "cuda_driver": 12040,
                     "cupy": "13.3.0"},
        "git": {"commit": commit, "dirty": False}, "host": "gpu-box", "timed": True, "sizes": "sizes",
        "seed": 0, "repeat": 50,
        "ops": {"softmax_forward": {"summary": "softmax", "default_version": 2, "bound": "memory"},
                "matmul_forward": {"summary": "matmul", "default_version": 2, "bound": "flops"}},
        "results": results,
    }


@pytest.fixture
def before_after(tmp_path):
    before = tmp_path / "before.json"
    after = tmp_path / "after.json"
    before.write_text(json.dumps(synthetic_gpu_record()))
    after.write_text(json.dumps(synthetic_gpu_record(speed=0.5, commit="2" * 40, date="2025-01-02T12:00:00Z",
                                                     regress=True, fix=True)))
    return before, after


# ----------------------------------------------------------------------------------------------
# a run in the emulator


@needs_matplotlib
def test_emulator_run_writes_record_and_plot(tmp_path):
    out = tmp_path / "results"
    plot = tmp_path / "sweep.png"
    rc, stdout, stderr = run("--ops", "gelu_forward", "--backend", "sim", "--out", str(out), "--plot", str(plot))
    assert rc == 0, stdout + stderr
    assert "does not model GPU time" in stdout and "recorded no timings" in stdout
    assert "gelu_forward v1: PASS at 6 block sizes" in stdout
    assert f"{len(llmcupy.ops['gelu_forward'].versions)} passed, 0 failed, 0 skipped" in stdout
    assert "\r" not in stderr  # stderr is not a terminal: no tqdm bar clutter (disable=None)

    files = list(out.glob("*.json"))
    assert len(files) == 1 and "_sim_" in files[0].name
    rec = json.loads(files[0].read_text())
    assert rec["schema"] == bench.SCHEMA
    for key in ("date", "command", "backend", "device", "software", "git", "timed", "no_timings", "ops", "results"):
        assert key in rec, key
    assert rec["backend"] == "sim" and rec["timed"] is False
    assert rec["command"] == (f"python -m llmcupy.bench --ops gelu_forward --backend sim --out {out} "
                              f"--plot {plot}")
    datetime.datetime.fromisoformat(rec["date"].replace("Z", "+00:00"))
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", rec["git"]["commit"])
    assert "python" in rec["software"] and "numpy" in rec["software"]
    assert [(r["op"], r["version"]) for r in rec["results"]] == [("gelu_forward", 1), ("gelu_forward", 2)]
    assert rec["ops"]["gelu_forward"]["source"] == bench.kernel_source_digest("gelu_forward.cu")
    assert rec["ops"]["gelu_forward"]["launcher"] == bench.launcher_digest("gelu_forward")
    for r in rec["results"]:
        assert r["ok"] is True and r["sizes"] == {"B": 2, "T": 8, "C": 64}
        assert [b["block_size"] for b in r["blocks"]] == [32, 64, 128, 256, 512, 1024]
        for b in r["blocks"]:
            assert b["ok"] is True
            assert set(b["errors"]["out"]) >= {"max_abs", "max_rel", "mismatches"}
            assert "ms" not in b and "fraction_of_bound" not in b  # no timings in the emulator
    assert_png(plot)

    # the file lists, and plots again from disk
    rc, stdout, _ = run("--list-results", "--out", str(out))
    assert rc == 0 and files[0].name in stdout and "2 passed" in stdout and "correctness only" in stdout
    replot = tmp_path / "again.png"
    rc, stdout, _ = run("--from", str(files[0]), "--plot", str(replot))
    assert rc == 0 and "gelu_forward v2*: PASS" in stdout
    assert_png(replot)


def test_the_record_is_saved_after_every_version_and_marked_partial_until_the_end(tmp_path, monkeypatch):
    # a run stopped by a time limit (bench/gpu_session.sh) keeps the versions it finished
    seen = []
    real_save = bench.save

    def spy(record, out_dir, path=None):
        path = real_save(record, out_dir, path)
        seen.append((path, json.loads(path.read_text())))
        return path

    monkeypatch.setattr(bench, "save", spy)
    rc = bench.main(["--ops", "gelu_forward", "--backend", "sim", "--no-progress", "--no-analyze",
                     "--out", str(tmp_path)])
    assert rc == 0
    assert len({path for path, _ in seen}) == 1 and list(tmp_path.glob("*.json")) == [seen[0][0]]
    versions = len(bench.plan_for(["gelu_forward"]))
    assert [len(r["results"]) for _, r in seen] == list(range(1, versions + 1)) + [versions]
    assert all(r["partial"] for _, r in seen[:-1]) and "partial" not in seen[-1][1]
    assert not list(tmp_path.glob("*.tmp"))
    assert "stopped early" not in bench.list_results(tmp_path)


def test_unknown_op_is_a_usage_error(tmp_path):
    rc, stdout, stderr = run("--ops", "softmaxx", "--backend", "sim", "--out", str(tmp_path))
    assert rc == 2
    assert "unknown op 'softmaxx'" in stderr
    assert not list(tmp_path.glob("*.json"))


@needs_matplotlib
def test_failed_version_exits_1_and_is_recorded(tmp_path, monkeypatch, capsys):
    """A version that fails validation (or crashes) is recorded, plotted, and fails the run."""
    real = bench._sweep_one

    def fake(op_name, number, small, seed, repeat, trainer=False):
        result = real(op_name, number, small, seed, repeat, trainer)
        if number == 2:
            result["blocks"][1]["ok"] = False
            result["blocks"][1]["checks"][0].update(ok=False, mismatches=3)
            result["ok"] = False
        return result

    monkeypatch.setattr(bench, "_sweep_one", fake)
    plot = tmp_path / "p.png"
    rc = bench.main(["--ops", "gelu_forward", "--no-isolate", "--no-progress", "--out", str(tmp_path),
                     "--plot", str(plot)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "gelu_forward v2*: FAIL at 6 block sizes" in out and "(failed at 64)" in out
    assert "1 passed, 1 failed, 0 skipped" in out
    rec = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert [r["ok"] for r in rec["results"]] == [True, False]
    assert_png(plot)


def test_crashing_version_is_an_error_entry(monkeypatch):
    from llmcupy.ops import OpError

    def boom(op_name, number, small, seed, repeat, trainer=False):
        raise OpError("the kernel refused")

    monkeypatch.setattr(bench, "_sweep_one", boom)
    rec = bench.run(["gelu_forward"], isolate=False, progress=False, log=io.StringIO())
    assert [r["error"] for r in rec["results"]] == ["the kernel refused"] * 2
    assert rec["summary"] == {"passed": 0, "failed": 2, "skipped": 0}
    assert bench.format_entry(rec["results"][0]) == "gelu_forward v1: ERROR the kernel refused"


def test_a_version_whose_child_dies_names_the_command_that_checks_it(monkeypatch):
    # a kernel's write past an array's end killing the emulator's child (glibc's abort): the entry
    # gives the command that runs that version under memcheck, not only the signal
    import faulthandler

    real = bench._sweep_one

    def abort_in_version_1(op_name, number, *args, **kwargs):
        if number == 1:
            faulthandler.disable()   # pytest's handler would print this expected abort's traceback
            os.abort()
        return real(op_name, number, *args, **kwargs)

    monkeypatch.setattr(bench, "_sweep_one", abort_in_version_1)
    rec = bench.run(["gelu_forward"], isolate=True, progress=False, log=io.StringIO(), analyze=False)
    assert rec["results"][0]["error"] == (
        "the emulator process died with signal 6 (SIGABRT) (see stderr); a kernel's out-of-bounds write can do "
        "this: python -m llmcupy.kernel gelu_forward 1 --sanitize runs it under memcheck, which names the access")
    assert rec["summary"] == {"passed": 1, "failed": 1, "skipped": 0}


def test_a_run_from_python_records_the_call_not_a_command_line(monkeypatch):
    # before: "python -m llmcupy.bench", a command nobody typed (the notebook's sweep, say), which
    # reruns the whole catalogue instead of the one op
    monkeypatch.setattr(bench, "_sweep_one", lambda *args: {"ok": None, "skipped": "stub"})
    rec = bench.run(["gelu_forward"], isolate=False, progress=False, log=io.StringIO())
    assert rec["command"] == "llmcupy.bench.run(['gelu_forward'])"
    rec = bench.run(["gelu_forward"], isolate=False, progress=False, log=io.StringIO(), command="python -m x")
    assert rec["command"] == "python -m x"


# ----------------------------------------------------------------------------------------------
# GPU records: plot and compare


@needs_matplotlib
def test_plot_of_a_gpu_record(tmp_path, before_after):
    before, _ = before_after
    plot = tmp_path / "gpu.png"
    rc, stdout, stderr = run("--from", str(before), "--plot", str(plot))
    assert rc == 0, stdout + stderr
    assert "softmax_forward v3: FAIL" in stdout
    assert "softmax_forward v2*: PASS at 6 block sizes, max rel err 3.0e-07; best 1.5000 ms @ 256, 2193 GB/s, " in stdout
    assert "matmul_forward v3: SKIP (unavailable: no cuBLASLt binding)" in stdout
    assert_png(plot)


def test_a_best_time_names_the_bound_its_fraction_is_of():
    # before: "76% of bound" in both lines, which left the reader to guess copy bandwidth or cuBLAS
    lines = {(e["op"], e["version"]): bench.format_entry(e) for e in synthetic_gpu_record()["results"]}
    assert lines["softmax_forward", 2].endswith(
        "best 1.5000 ms @ 256, 2193 GB/s, 76% of the measured copy bandwidth (2900 GB/s)")
    assert lines["matmul_forward", 2].endswith("best 9.0000 ms @ 16, 222.22 TFLOP/s, 44% of cuBLAS's speed (4.0000 ms)")


@needs_matplotlib
def test_plot_results_api_returns_a_figure(tmp_path):
    rec = synthetic_gpu_record()
    fig = bench.plot_results(rec, ops=["matmul_forward"])
    titles = [ax.get_title() for ax in fig.axes]
    assert any(t.startswith("matmul_forward") for t in titles)
    assert any("best version against its upper bound" in t for t in titles)
    assert not any(t.startswith("softmax_forward") for t in titles)
    with pytest.raises(ValueError, match="nothing to plot"):
        bench.plot_results(rec, ops=["nope"])


@needs_matplotlib
def test_plot_of_an_op_none_of_whose_versions_ran_warns_nothing(tmp_path):
    # before: matplotlib's "Attempting to set identical low and high xlims" UserWarning on the terminal
    import warnings

    path = tmp_path / "k.json"
    path.write_text(json.dumps([{"op": "attention_forward", "version": 5, "summary": "bf16", "backend": "sim",
                                 "ok": None, "skipped": "unavailable: needs BF16", "blocks": []}]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bench.plot_results(bench.load(path), tmp_path / "p.png")
    assert_png(tmp_path / "p.png", min_bytes=1000)


@needs_matplotlib
def test_emulator_plot_is_titled_correctness_only():
    rec = synthetic_gpu_record()
    rec.update(backend="sim", device="CPU emulator (sim)", timed=False)
    for r in rec["results"]:
        r.pop("best", None)
        for b in r["blocks"]:
            for k in ("ms", "min_ms", "max_ms", "gbs", "tflops", "fraction_of_bound"):
                b.pop(k, None)
    fig = bench.plot_results(rec)
    assert fig._suptitle.get_text().startswith(bench.EMULATOR_TITLE)
    assert any(ax.get_ylabel() == "max relative error (log)" for ax in fig.axes)


def test_compare_prints_deltas_and_flags_regressions(before_after):
    before, after = before_after
    rc, stdout, stderr = run("compare", str(before), str(after))
    assert rc == 1, stdout + stderr  # softmax_forward v2 passed before and fails after
    lines = {tuple(l.split()[:2]): l for l in stdout.splitlines() if l.startswith(("softmax_forward", "matmul_forward"))}
    v1 = lines[("softmax_forward", "1")]
    assert re.search(r"8\.0000\s+\(64\)\s+4\.0000\s+\(64\)\s+2\.00x\s+PASS$", v1), v1
    assert "PASS -> FAIL  REGRESSION" in lines[("softmax_forward", "2")]
    assert "FAIL -> PASS  fixed" in lines[("softmax_forward", "3")]
    assert re.search(r"40\.0000\s+\(16\)\s+20\.0000\s+\(16\)\s+2\.00x\s+PASS$", lines[("matmul_forward", "1")])
    assert lines[("matmul_forward", "3")].rstrip().endswith("SKIP")
    assert "commit 1111111111" in stdout and "commit 2222222222" in stdout
    assert "3 versions passing and timed in both at the same sizes: geometric-mean speed-up 2.00x" in stdout
    assert "REGRESSED" in stdout

    rc, stdout, _ = run("compare", str(before), str(before), "--blocks")
    assert rc == 0
    assert "1.00x" in stdout and "REGRESS" not in stdout
    assert re.search(r"9\.0000\s+\(32\)\s+9\.0000\s+\(32\)\s+1\.00x\s+PASS", stdout)  # a per-block row


def test_compare_reports_versions_in_one_run_only_and_device_changes(tmp_path):
    a = synthetic_gpu_record()
    b = copy.deepcopy(a)
    b["device"] = "NVIDIA A100-SXM4-80GB"
    b["results"] = [r for r in b["results"] if r["op"] == "softmax_forward"]
    text, regressed = bench.compare(a, b)
    assert not regressed
    assert "different devices" in text
    assert re.search(r"matmul_forward\s+1 .*only in before \(PASS\)", text)


def test_compare_warns_when_one_run_had_tf32_and_the_other_not():
    # before: a --trainer-shapes run (TF32 on) against a plain one showed the cuBLAS versions' tensor-core
    # speed-up as if the code had changed, without a word
    a = synthetic_gpu_record()
    b = dict(synthetic_gpu_record(speed=0.5), tf32=True)
    text, _ = bench.compare(a, b)
    assert ("warning: TF32 was off before and on after: the versions that call cuBLAS are not comparable"
            in text.splitlines()), text
    assert "TF32" not in bench.compare(a, a)[0]


def test_compare_gives_no_speed_up_between_different_sizes():
    # before: "(sizes differ)" was noted, yet its ratio was printed as a speed-up and averaged in
    a = synthetic_gpu_record()
    b = synthetic_gpu_record(speed=0.5)
    for r in b["results"]:
        if (r["op"], r["version"]) == ("softmax_forward", 1):
            r["sizes"] = {"B": 4, "T": 1024, "V": 50257}
    text, regressed = bench.compare(a, b)
    line = next(l for l in text.splitlines() if l.startswith("softmax_forward") and l.split()[1] == "1")
    assert re.search(r"8\.0000\s+\(64\)\s+4\.0000\s+\(64\)\s+-\s+PASS  \(sizes differ\)$", line), line
    assert "3 versions passing and timed in both at the same sizes: geometric-mean speed-up 2.00x" in text  # of 4
    text, _ = bench.compare(a, b, blocks=True)
    rows = text.split(line)[1].split("\nsoftmax_forward")[0].strip().splitlines()
    assert len(rows) == 6 and all(re.search(r"\s-\s+PASS$", r) for r in rows), rows


def test_compare_of_emulator_records_has_no_speedups(tmp_path):
    rec = synthetic_gpu_record()
    for r in rec["results"]:
        r.pop("best", None)
    text, regressed = bench.compare(rec, rec)
    assert not regressed
    assert "no version has times in both runs" in text


def test_the_source_digest_follows_the_kernel_file_and_its_project_headers(tmp_path, monkeypatch):
    # two runs of one commit with a kernel edited between them (a dirty checkout) were told apart by
    # their dates alone; the digest covers the .cu file and the kernels_cu headers it includes
    from llmcupy.runtime import module

    shutil.copytree(module.kernels_dir(), tmp_path / "k")
    monkeypatch.setattr(module, "kernels_dir", lambda: tmp_path / "k")
    first = bench.kernel_source_digest("gelu_forward.cu")
    assert first == bench.kernel_source_digest("gelu_forward.cu")
    (tmp_path / "k" / "common.cuh").write_text((tmp_path / "k" / "common.cuh").read_text() + "\n// edited\n")
    second = bench.kernel_source_digest("gelu_forward.cu")
    assert second != first
    (tmp_path / "k" / "softmax_forward.cu").write_text("// another op's file\n")
    assert bench.kernel_source_digest("gelu_forward.cu") == second


def test_compare_names_the_ops_whose_kernel_sources_differ():
    def rec(sources, launchers=None):
        r = synthetic_gpu_record()
        r["ops"] = {name: {"source": digest, "launcher": (launchers or {}).get(name, "l" * 16)}
                    for name, digest in sources.items()}
        return r

    before = rec({"gelu_forward": "a" * 16, "softmax_forward": "b" * 16})
    text, _ = bench.compare(before, rec({"gelu_forward": "a" * 16, "softmax_forward": "c" * 16}))
    assert "sources that differ between the runs: softmax_forward (kernel file) (1 of 2 op(s))" in text
    # a launcher edited (its grid, block or kernel choice), the kernel file as it was
    text, _ = bench.compare(before, rec({"gelu_forward": "a" * 16, "softmax_forward": "c" * 16},
                                        {"gelu_forward": "m" * 16, "softmax_forward": "m" * 16}))
    assert ("sources that differ between the runs: gelu_forward (launcher), softmax_forward (kernel file and "
            "launcher) (2 of 2 op(s))") in text
    text, _ = bench.compare(before, before)
    assert "sources (kernel files and launchers): the same in both runs (2 op(s))" in text
    text, _ = bench.compare(before, rec({"gelu_forward": None}))   # a record from before the digests
    assert "sources" not in text


def test_the_launcher_digest_is_the_op_modules():
    import hashlib
    import importlib

    path = importlib.import_module("llmcupy.ops.gelu_forward").__file__
    assert bench.launcher_digest("gelu_forward") == hashlib.sha256(open(path, "rb").read()).hexdigest()[:16]
    assert bench.launcher_digest("gelu_forward") != bench.launcher_digest("softmax_forward")


def _emulator_record(analyses, date="2025-01-01T12:00:00Z", dirty=False):
    """An emulator record as `bench` writes it, its metrics from real analyses: ``{version: analysis}``,
    each analysis recorded under that version number (standing in for the version before or after an
    edit of its kernel)."""
    results = []
    for number, analysis in analyses.items():
        raw = {"op": analysis["op"], "version": number, "summary": f"version {number}", "ok": True,
               "sizes": analysis["sizes"], "blocks": [], "analysis": analysis}
        results.append(bench._version_entry_from_raw(raw))
    return {"schema": bench.SCHEMA, "date": date, "command": "python -m llmcupy.bench --ops softmax_forward",
            "backend": "sim", "device": "CPU emulator (sim)", "git": {"commit": "1" * 40, "dirty": dirty},
            "timed": False, "sizes": "sim_sizes", "results": results}


def _metrics_rows(text):
    """The rows of compare's table of emulator counts, by version."""
    section = text.split("(not a measurement), before -> after where they differ:\n")[1].split("\n\n")[0]
    return {int(l.split()[1]): l for l in section.splitlines() if l.startswith("softmax_forward")}


@pytest.fixture(scope="module")
def softmax_analyses():
    from llmcupy import analyze

    return {v: analyze.analyze_version("softmax_forward", v) for v in (1, 4, 7)}


def test_compare_of_emulator_records_sets_counts_and_model_side_by_side(tmp_path, capsys, softmax_analyses):
    # before: two emulator records, before and after an edit of a kernel, compared as "no version has
    # times in both runs (an emulator run records correctness only)", although both held the counts
    from llmcupy.analyze import _us

    a1, a4, a7 = (softmax_analyses[v] for v in (1, 4, 7))
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    # the edit: version 1 now reads its row as version 7 does; version 2 is untouched
    before.write_text(json.dumps(_emulator_record({1: a1, 2: a4})))
    after.write_text(json.dumps(_emulator_record({1: a7, 2: a4}, date="2025-01-01T12:05:00Z", dirty=True)))
    assert bench.main(["compare", str(before), str(after)]) == 0
    text = capsys.readouterr().out
    assert ("emulator counts and a roofline MODEL of the time on H100 SXM (not a measurement), before -> after "
            "where they differ:") in text
    rows = _metrics_rows(text)
    s1, s7 = a1["summary"], a7["summary"]
    assert f"{s1['global_requests']} -> {s7['global_requests']}" in rows[1]
    assert f"{s1['sectors_per_request']:.2f} -> {s7['sectors_per_request']:.2f}" in rows[1]
    assert f"{s1['moved_over_ideal']:.2f} -> {s7['moved_over_ideal']:.2f}" in rows[1]
    assert f"- -> {s7['conflict_ways']:.2f}" in rows[1]   # version 7 uses shared memory, version 1 none
    model = re.escape(f"{_us(s1['model_seconds'])} -> {_us(s7['model_seconds'])}")
    assert re.search(model + rf"\s+{s1['model_seconds'] / s7['model_seconds']:.2f}x$", rows[1]), rows[1]
    assert "->" not in rows[2], rows[2]
    assert re.search(re.escape(_us(a4["summary"]["model_seconds"])) + r"\s+1\.00x$", rows[2]), rows[2]
    assert "1 of 2 versions analysed in both differ in their counts or model time: softmax_forward 1" in text
    assert "model ratio: the model's time before over after" in text
    assert ("no times: both are emulator runs, which run the kernels on the CPU and never time a GPU; below, each "
            "version's verdict and the emulator's counts") in text.splitlines()


def test_compare_of_emulator_runs_prints_no_empty_time_columns(softmax_analyses):
    # before: two emulator records were compared in the GPU's table, columns of ms, block size and
    # speed-up holding nothing but dashes for every version (and block size with --blocks), and a
    # line at the end said why
    before = _emulator_record({1: softmax_analyses[1], 2: softmax_analyses[4]})
    after = copy.deepcopy(before)
    after["results"][1]["ok"] = False
    for with_blocks in (False, True):
        for entry in (before, after):
            entry["results"][1]["blocks"] = [{"block_size": 64, "ok": entry is before}, {"block_size": 128, "ok": True}]
        text, regressed = bench.compare(before, after, blocks=with_blocks)
        assert regressed
        lines = text.splitlines()
        assert "ms" not in text.split("emulator counts")[0] and "speed-up" not in text, text
        assert sum(line.startswith("no times: ") for line in lines) == 1 and "no version has times" not in text
        header = "op ver (blk) correctness" if with_blocks else "op ver correctness"
        assert header in [" ".join(line.split()) for line in lines], text
        rows = [" ".join(line.split()) for line in lines if line.startswith("softmax_forward")]
        assert rows[:2] == ["softmax_forward 1 PASS", "softmax_forward 2 PASS -> FAIL REGRESSION"], rows
        if with_blocks:
            assert [" ".join(line.split()) for line in lines if line.startswith(" " * 30)] == [
                "(64) PASS -> FAIL", "(128) PASS"], text
    # GPU runs keep their columns
    assert "before ms" in bench.compare(synthetic_gpu_record(), synthetic_gpu_record(speed=0.5))[0]


def test_compare_of_emulator_counts_gives_no_model_ratio_across_sizes_or_model_gpus(softmax_analyses):
    # the model's ratio between other sizes, or between two GPUs' models, would credit the edit with
    # what the sizes or the GPU changed
    from llmcupy import analyze

    a1, a4 = softmax_analyses[1], softmax_analyses[4]
    smaller = analyze.analyze_version("softmax_forward", 1, {"B": 1, "T": 8, "V": 2053})
    on_a100 = analyze.analyze_version("softmax_forward", 4, gpu_name="a100-sxm")
    text, _ = bench.compare(_emulator_record({1: a1, 2: a4}), _emulator_record({1: smaller, 2: on_a100}))
    rows = _metrics_rows(text)
    assert re.search(r"\s-  \(sizes differ\)$", rows[1]), rows[1]
    assert re.search(r"\s-  \(model on H100 SXM -> A100 SXM 80GB\)$", rows[2]), rows[2]
    assert ("warning: the two runs model different GPUs (--gpu); their model times and occupancies are not "
            "comparable") in text.splitlines()


def test_compare_says_when_only_one_emulator_run_holds_counts(softmax_analyses):
    # a run made with --no-analyze against one with counts: without a word, the user would look for a
    # table that is not there
    with_counts = _emulator_record({1: softmax_analyses[1]})
    without = copy.deepcopy(with_counts)
    del without["results"][0]["metrics"]   # a run with --no-analyze
    text, _ = bench.compare(with_counts, without)
    assert ("only the before run holds emulator counts (--analyze metrics), so they are not compared; an emulator "
            "bench run records them unless --no-analyze") in text.splitlines()
    assert "roofline MODEL" not in text
    assert ("no times: both are emulator runs, which run the kernels on the CPU and never time a GPU; below, each "
            "version's verdict") in text.splitlines()
    gpu_text, _ = bench.compare(synthetic_gpu_record(), synthetic_gpu_record(speed=0.5))
    assert "emulator counts" not in gpu_text   # GPU records hold none: nothing to say about them


def test_compare_does_not_blame_no_analyze_when_no_version_of_a_run_ran(softmax_analyses):
    # an edit that broke the kernel file: every version of the after run is an ERROR, so it holds no
    # counts; the note said the run was made with --no-analyze, sending the user to the wrong cause
    before = _emulator_record({1: softmax_analyses[1]})
    broken = copy.deepcopy(before)
    broken["results"][0] = {"op": "softmax_forward", "version": 1, "summary": "version 1", "ok": False,
                            "error": "the emulator could not compile softmax_forward.cu:\n...", "blocks": []}
    text, regressed = bench.compare(before, broken)
    assert regressed
    assert "--no-analyze" not in text, text
    assert ("only the before run holds emulator counts (--analyze metrics): no version of the after run ran to a "
            "result (each is an ERROR or a SKIP above), so there are none to compare") in text.splitlines()


def test_compare_bad_file_is_a_usage_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    rc, _, stderr = run("compare", str(bad), str(bad))
    assert rc == 2 and "not a benchmark record" in stderr


@pytest.mark.parametrize("content,message", [
    (None, "{path}: no such file"),
    ("not json", "{path}: not a benchmark record (not JSON: "),
    ("[1, 2]", "{path}: not a benchmark record (a list, but not of python -m llmcupy.kernel --json results"),
    ('{"results": 5}', "{path}: not a benchmark record ('results' is not a list of entries with 'op' and 'version')"),
])
@pytest.mark.parametrize("cli", [["--from", "{path}"], ["compare", "{path}", "{path}"]])
def test_a_file_that_is_not_a_record_is_one_line_naming_it(tmp_path, capsys, cli, content, message):
    # before: `--from` printed "[Errno 2] ...", a bare "Expecting value: line 1 column 1 (char 0)",
    # or a traceback for JSON of another shape
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    rc = bench.main([a.replace("{path}", str(path)) for a in cli])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: " + message.replace("{path}", str(path))), err
    assert len(err.strip().splitlines()) == 1, err


def test_from_with_ops_refuses_an_unknown_op_or_one_the_record_lacks(tmp_path, capsys):
    # before: both printed nothing and exited 0
    path = tmp_path / "k.json"
    path.write_text(json.dumps([{"op": "softmax_forward", "version": 5, "summary": "online", "backend": "sim",
                                 "ok": True, "blocks": []}]))
    assert bench.main(["--from", str(path), "--ops", "softmaxx"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown op 'softmaxx'; ops: adamw, ")
    assert bench.main(["--from", str(path), "--ops", "gelu_forward"]) == 2
    assert capsys.readouterr().err.strip() == f"error: {path} has no results of gelu_forward; it has softmax_forward"
    assert bench.main(["--from", str(path), "--ops", "softmax_forward"]) == 0
    assert "softmax_forward v5" in capsys.readouterr().out


def test_load_accepts_the_kernel_cli_json(tmp_path):
    """`python -m llmcupy.kernel --json` writes a list of sweeps; bench reads it too."""
    path = tmp_path / "k.json"
    path.write_text(json.dumps([{"op": "softmax_forward", "version": 5, "summary": "online", "backend": "cuda",
                                 "device": "NVIDIA H100", "ok": True, "blocks": [
                                     {"block_size": 256, "ok": True, "mean_ms": 1.0, "min_ms": 0.9, "max_ms": 1.1,
                                      "gbs": 3000.0, "fraction_of_bound": 0.9,
                                      "checks": [{"name": "out", "ok": True, "max_abs": 1e-7, "max_rel": 1e-7,
                                                  "mismatches": 0}]}]}]))
    rec = bench.load(path)
    assert rec["timed"] and rec["device"] == "NVIDIA H100"
    assert rec["results"][0]["best"] == {"block_size": 256, "ms": 1.0, "gbs": 3000.0, "fraction_of_bound": 0.9}


REPO = __import__("pathlib").Path(__file__).resolve().parents[1]


def test_emulator_records_go_to_an_ignored_folder_not_among_gpu_results(tmp_path, monkeypatch, capsys):
    # the default folders are the checkout's bench/results (where `bench defaults` reads), wherever the
    # command runs: before, a run from another folder wrote its record to bench/results/sim of that
    # folder, and --list-results from there (or from the checkout) did not find the other's runs

    checkout, elsewhere = tmp_path / "checkout", tmp_path / "elsewhere"
    stand_in_checkout(monkeypatch, checkout)
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert bench.main(["--ops", "gelu_forward", "--backend", "sim", "--no-progress", "--no-analyze"]) == 0
    stdout = capsys.readouterr().out
    files = list((checkout / "bench" / "results" / "sim").glob("*.json"))
    assert len(files) == 1 and f"results: {files[0]}" in stdout.splitlines(), stdout   # named in full
    assert not list((checkout / "bench" / "results").glob("*.json"))   # the GPU folder stays empty
    assert not list(elsewhere.rglob("*.json"))
    # --list-results finds it without --out, from here and from the checkout: it lists the emulator's
    # folder beside the GPU one
    assert bench.main(["--list-results"]) == 0
    stdout = capsys.readouterr().out
    assert f"{files[0]}: " in stdout and f"no results under {checkout / 'bench' / 'results'}/" in stdout, stdout
    monkeypatch.chdir(checkout)
    assert bench.main(["--list-results"]) == 0
    stdout = capsys.readouterr().out   # inside the checkout, named from the working folder
    assert f"bench/results/sim/{files[0].name}: " in stdout and "no results under bench/results/" in stdout, stdout
    # a folder given is the working folder's, as typed
    monkeypatch.chdir(elsewhere)
    assert bench.main(["--ops", "gelu_forward", "--backend", "sim", "--no-progress", "--no-analyze",
                       "--out", "mine"]) == 0
    mine = list((elsewhere / "mine").glob("*.json"))
    assert len(mine) == 1 and f"results: {os.path.join('mine', mine[0].name)}" in capsys.readouterr().out
    # in a checkout, git ignores that folder: a bench run in the emulator leaves `git status` clean
    if (REPO / ".git").exists():
        probe = "bench/results/sim/" + files[0].name
        proc = subprocess.run(["git", "check-ignore", "-q", probe], cwd=REPO)
        assert proc.returncode == 0, f"{probe} is not git-ignored"


def test_compare_refuses_an_emulator_record_against_a_gpu_record(tmp_path):
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps(synthetic_gpu_record()))
    emu_rec = synthetic_gpu_record()
    emu_rec.update(backend="sim", device="CPU emulator (sim)", timed=False)
    emu = tmp_path / "sim.json"
    emu.write_text(json.dumps(emu_rec))
    rc, stdout, stderr = run("compare", str(emu), str(gpu))
    assert rc == 2 and "will not compare an emulator record with a GPU record" in stderr
    assert f"{emu} is an emulator run" in stderr and not stdout
    assert run("compare", str(gpu), str(gpu))[0] == 0


@pytest.mark.parametrize("args,message", [
    (["--seed", "-2"], "argument --seed: needs an integer >= 0, got -2"),
    (["--repeat", "0"], "argument --repeat: needs an integer >= 1, got 0"),
])
def test_bad_numbers_are_usage_errors_before_the_run(monkeypatch, capsys, args, message):
    monkeypatch.setattr(bench, "run", lambda *a, **k: pytest.fail("the benchmark ran with a bad number"))
    with pytest.raises(SystemExit) as info:
        bench.main(["--ops", "gelu_forward", "--no-progress", *args])
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_help_is_wrapped():
    proc = subprocess.run([sys.executable, "-m", "llmcupy.bench", "--help"], capture_output=True, text=True,
                          env=dict(__import__("os").environ, COLUMNS="80"))
    assert proc.returncode == 0
    # the description and the options are wrapped; the epilog's example command lines stay verbatim
    long = [line for line in proc.stdout.splitlines() if len(line) > 80 and not line.lstrip().startswith("python -m")]
    assert not long, long


@pytest.mark.parametrize("args,message", [
    (["--out", "/proc/zz"], "error: --out /proc/zz: cannot create the folder"),
    (["--plot", "x.bogus"], "error: --plot x.bogus: matplotlib cannot write .bogus files; use one of "),
    (["--plot", "/no/such/folder/x.png"], "error: --plot /no/such/folder/x.png: the folder /no/such/folder does not exist"),
])
def test_bad_output_paths_are_refused_before_the_run(monkeypatch, capsys, args, message):
    def must_not_run(*a, **k):
        raise AssertionError("the benchmark ran before its output paths were checked")

    monkeypatch.setattr(bench, "run", must_not_run)
    rc = bench.main(["--ops", "gelu_forward", "--no-progress", *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(message) and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("args,message", [
    # before: taken without a word, as if the record held the model on that GPU
    (["--gpu", "a100-sxm", "--no-analyze"], "error: --gpu a100-sxm names the GPU of the roofline model, which "
                                            "--no-analyze leaves out; drop one of them"),
    (["--gpu", "a100-sxm", "cuda"], "error: --gpu a100-sxm names the GPU of the roofline model, which only an "
                                    "emulator run records (this cuda run measures times); drop --gpu"),
    (["--gpu", "v100"], "error: unknown GPU 'v100' for the model; choose one of h100-sxm, "),
])
def test_a_model_gpu_the_run_would_not_use_is_refused_before_the_run(monkeypatch, capsys, args, message):
    from llmcupy.runtime import backend

    def must_not_run(*a, **k):
        raise AssertionError("the benchmark ran with a --gpu it does not use")

    monkeypatch.setattr(bench, "run", must_not_run)
    if "cuda" in args:   # a GPU run (the backend faked: nothing runs)
        args = [a for a in args if a != "cuda"]
        monkeypatch.setattr(backend, "get_backend", lambda: "cuda")
    else:
        args = ["--backend", "sim", *args]
    rc = bench.main(["--ops", "gelu_forward", "--no-progress", "--no-save", *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(message) and len(err.strip().splitlines()) == 1, err


def test_plot_formats_come_from_matplotlib(tmp_path):
    bench.check_plot_path(tmp_path / "x.svg")
    bench.check_plot_path(tmp_path / "x.PDF")
    bench.check_plot_path(tmp_path / "no_suffix")   # matplotlib's default format


def test_ctrl_c_stops_the_run_in_one_line_and_keeps_the_partial_record(tmp_path):
    sys.path.insert(0, os.path.dirname(__file__))
    from _helpers import ctrl_c_after

    rc, out, err = ctrl_c_after(["llmcupy.bench", "--backend", "sim", "--no-progress", "--no-analyze",
                                 "--out", str(tmp_path)], "adamw v2")  # v1 is saved by then
    assert rc == 130, (rc, out[-2000:], err)
    assert "Traceback" not in out + err, err
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and err.strip().splitlines()[-1] == (
        f"interrupted; the versions that finished are in {files[0]} (marked partial)"), err
    record = json.loads(files[0].read_text())
    assert record["partial"] is True and 1 <= len(record["results"]) < 90
    shown = [line for line in out.splitlines() if re.match(r"\w+ v\d+\*?: ", line)]
    assert len(record["results"]) >= len(shown), (record["results"], shown)   # every version it printed

