"""Defaults from measurements: ``python -m llmcupy.bench defaults`` picks, per op of the training
step, the fastest passing deterministic version of the newest GPU run at the trainer's shapes per
device, and writes ``bench/defaults.json``; the trainer's KernelChoice follows it on that GPU.

No GPU results exist yet, so the records here are synthetic (written to a tmp folder in the format
``bench.save`` writes); the mechanism must also work with none."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest

import llmcupy
from llmcupy import bench, defaults
from llmcupy.model import STEP_OPS, KernelChoice

from _helpers import stand_in_checkout

GPU, OTHER = "NVIDIA Test GPU 80GB", "NVIDIA Other GPU"


def _entry(op, version, ms, ok=True, sizes=None, block=256):
    sizes = defaults.trainer_sizes()[op] if sizes is None else sizes
    e = {"op": op, "version": version, "summary": "", "ok": ok, "sizes": dict(sizes), "blocks": []}
    if ok and ms is not None:
        e["best"] = {"block_size": block, "ms": ms}
    return e


def _record(results, device=GPU, date="2026-11-01T00:00:00Z", backend="cuda", sizes="trainer", commit="a" * 40,
            tf32=defaults.TRAINER_TF32):
    return {"schema": bench.SCHEMA, "date": date, "command": "python -m llmcupy.bench --trainer-shapes",
            "backend": backend, "device": device, "software": {}, "git": {"commit": commit, "dirty": False},
            "timed": backend == "cuda", "sizes": sizes, "tf32": tf32, "ops": {}, "results": results}


def _save(folder, record, name):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(record))


def _call(argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = bench.main([str(a) for a in argv])
        except SystemExit as exc:
            rc = exc.code
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture
def results(tmp_path):
    d = tmp_path / "results"
    newest = _record([
        _entry("layernorm_forward", 6, 0.050, block=128),
        _entry("layernorm_forward", 3, 0.040, block=512),           # fastest that passed
        _entry("layernorm_forward", 4, 0.010, ok=False),            # faster, but wrong
        _entry("encoder_backward", 1, 0.001),                       # fastest, but fp32 atomics (nondeterministic)
        _entry("encoder_backward", 2, 0.300),
        _entry("matmul_forward", 4, 0.001, sizes={"B": 32, "T": 1024, "C": 768, "OC": 3072}),  # not the trainer's shape
        _entry("matmul_forward", 2, 0.500),
        _entry("softmax_forward", 1, 0.001, sizes={"B": 4, "T": 1024, "V": 50257}),  # not a step op
    ], date="2026-11-02T00:00:00Z", commit="b" * 40)
    _save(d, newest, "20261102T000000Z_test_bbbbbbbbbb.json")
    # an older run of the same GPU: the newest run wins
    _save(d, _record([_entry("layernorm_forward", 5, 0.001)], date="2026-10-01T00:00:00Z"), "older.json")
    # another GPU; an emulator record and a GPU run at the spec's sizes count for nothing
    _save(d, _record([_entry("gelu_forward", 1, 0.02), _entry("gelu_forward", 2, 0.03)], device=OTHER), "other.json")
    _save(d, _record([_entry("gelu_forward", 1, 0.0)], device="CPU emulator (sim)", backend="sim"), "sim.json")
    _save(d, _record([_entry("adamw", 1, 0.0)], sizes="sizes"), "spec_sizes.json")
    return d


def test_trainer_sizes_name_every_step_op_by_its_own_size_names():
    sizes = defaults.trainer_sizes()
    assert set(sizes) == set(STEP_OPS)
    for op, s in sizes.items():
        assert set(s) == set(llmcupy.ops[op].sizes), op
    assert sizes["classifier_fused"]["P"] == 50304 and sizes["matmul_forward"]["OC"] == 3072


def test_defaults_pick_the_fastest_correct_deterministic_version_per_device(results, tmp_path):
    out = tmp_path / "defaults.json"
    rc, stdout, err = _call(["defaults", "--results", results, "--out", out])
    assert rc == 0, err
    doc = json.loads(out.read_text())
    assert doc["schema"] == defaults.SCHEMA and set(doc["devices"]) == {GPU, OTHER}
    gpu = doc["devices"][GPU]
    assert gpu["source"].endswith("20261102T000000Z_test_bbbbbbbbbb.json") and gpu["commit"] == "b" * 40
    assert gpu["ops"]["layernorm_forward"] == {"version": 3, "block_size": 512, "ms": 0.040,
                                               "catalogue_default": 6, "catalogue_default_ms": 0.050}
    assert gpu["ops"]["encoder_backward"]["version"] == 2
    assert gpu["ops"]["matmul_forward"]["version"] == 2
    assert "softmax_forward" not in gpu["ops"] and "adamw" not in gpu["ops"]
    assert doc["devices"][OTHER]["ops"]["gelu_forward"]["version"] == 1
    assert GPU in stdout and "layernorm_forward" in stdout and "1.25x slower" in stdout
    # --check: up to date now; out of date once a newer run says otherwise
    assert _call(["defaults", "--results", results, "--out", out, "--check"])[0] == 0
    _save(results, _record([_entry("layernorm_forward", 6, 0.01)], date="2026-11-03T00:00:00Z"), "newer.json")
    rc, stdout, _ = _call(["defaults", "--results", results, "--out", out, "--check"])
    assert rc == 1 and "out of date" in stdout
    assert json.loads(out.read_text()) == doc        # --check wrote nothing


def test_a_run_stopped_early_gives_no_default_for_the_op_it_was_in():
    # bench saves "partial" records as it goes; its last op may lack versions (here v3, faster)
    record = dict(_record([_entry("gelu_forward", 1, 0.02), _entry("gelu_forward", 2, 0.03),
                           _entry("layernorm_forward", 6, 0.05)]), partial=True)
    assert set(defaults.pick(record)) == {"gelu_forward"}
    assert set(defaults.pick(dict(record, partial=False))) == {"gelu_forward", "layernorm_forward"}


def test_no_gpu_results_give_a_file_naming_no_gpu(tmp_path):
    out = tmp_path / "defaults.json"
    (tmp_path / "none").mkdir()
    rc, stdout, err = _call(["defaults", "--results", tmp_path / "none", "--out", out])
    assert rc == 0, err
    assert json.loads(out.read_text())["devices"] == {}
    assert "catalogue's defaults" in stdout
    choice = KernelChoice()
    assert choice.use_measured(GPU, out) is False
    assert choice.version("layernorm_forward") == llmcupy.ops["layernorm_forward"].default_version
    assert "No default is measured yet" in defaults.provenance(out)
    assert defaults.load(tmp_path / "missing.json")["devices"] == {}


def test_a_missing_results_folder_keeps_the_measured_defaults(results, tmp_path):
    # a typo in --results: before, it derived "no GPU measured" and wrote that over the file's
    # measured defaults
    out = tmp_path / "defaults.json"
    assert _call(["defaults", "--results", results, "--out", out])[0] == 0
    before = out.read_bytes()
    rc, stdout, err = _call(["defaults", "--results", tmp_path / "reslts", "--out", out])
    assert rc == 2 and err.strip() == (f"error: --results {tmp_path / 'reslts'}: no such folder; give the folder "
                                       "of the recorded --trainer-shapes runs (default: bench/results of this "
                                       "checkout)"), err
    assert out.read_bytes() == before and GPU in json.loads(before)["devices"]
    rc, _, err = _call(["defaults", "--results", results, "--out", tmp_path])
    assert rc == 2 and err.strip() == f"error: --out {tmp_path}: it is a folder; give a file name", err


def test_no_results_folder_yet_says_no_gpu_run_is_recorded(tmp_path, monkeypatch):
    # a fresh clone: no GPU run has made bench/results. Before, `bench defaults` as the READMEs give
    # it blamed "--results bench/results", a flag the user never typed
    checkout = tmp_path / "checkout"
    stand_in_checkout(monkeypatch, checkout)
    out = tmp_path / "defaults.json"
    out.write_text("{}")
    rc, stdout, err = _call(["defaults", "--out", out])
    assert rc == 2 and err.strip() == (
        f"error: no GPU run is recorded yet: {checkout / 'bench' / 'results'} does not exist (python -m "
        "llmcupy.bench --trainer-shapes on a GPU makes it, or give --results DIR); "
        f"{out} is left as it is"), err
    assert out.read_text() == "{}"


def test_the_default_results_are_the_checkouts_from_any_working_folder(results, tmp_path, monkeypatch):
    # `bench defaults` writes the checkout's bench/defaults.json; it read bench/results of the working
    # folder, so from anywhere else it said "no GPU run is recorded yet" of a checkout that had runs,
    # and `--check` compared the checkout's file with no runs at all
    checkout = tmp_path / "checkout"
    stand_in_checkout(monkeypatch, checkout)
    results.rename(checkout / "bench" / "results")
    monkeypatch.delenv("LLMCUPY_DEFAULTS", raising=False)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "bench" / "results" / "sim").mkdir(parents=True)   # an emulator sweep made one here
    monkeypatch.chdir(elsewhere)
    rc, stdout, err = _call(["defaults"])
    assert rc == 0, err
    written = json.loads((checkout / "bench" / "defaults.json").read_text())
    assert set(written["devices"]) == {GPU, OTHER}
    assert written["devices"][GPU]["source"] == "bench/results/20261102T000000Z_test_bbbbbbbbbb.json"
    assert not (elsewhere / "bench" / "defaults.json").exists()
    rc, stdout, err = _call(["defaults", "--check"])
    assert rc == 0 and "up to date" in stdout, stdout + err


def test_an_install_without_its_checkout_records_runs_under_the_working_folder(tmp_path, monkeypatch):
    # a package installed without its checkout has no bench/ beside it: the default folders of the runs
    # are bench/results of the working folder there, not a folder made inside site-packages
    from pathlib import Path

    site = tmp_path / "site-packages"
    monkeypatch.setattr(defaults, "repo_dir", lambda: site)
    assert defaults.results_dir() == Path("bench", "results")
    # another distribution's top-level `bench` package beside ours is not a checkout: before, the runs
    # went into site-packages/bench/results
    (site / "bench").mkdir(parents=True)
    (site / "bench" / "__init__.py").write_text("")
    assert defaults.results_dir() == Path("bench", "results")
    monkeypatch.delenv("LLMCUPY_DEFAULTS", raising=False)
    assert defaults.default_path() == Path("bench", "defaults.json")   # what `bench defaults` writes, beside them
    assert bench.results_folder("sim") == Path("bench", "results", "sim")
    monkeypatch.chdir(tmp_path)
    assert bench.shown_path(bench.results_folder("sim")) == os.path.join("bench", "results", "sim")


def test_a_folder_with_no_run_does_not_erase_measured_defaults(results, tmp_path, monkeypatch):
    # --results naming the wrong folder (one with no GPU run at the trainer's shapes): before, the
    # file was rewritten naming no GPU, the measured defaults lost
    out = tmp_path / "defaults.json"
    assert _call(["defaults", "--results", results, "--out", out])[0] == 0
    before = out.read_bytes()
    empty = tmp_path / "sim_runs"
    _save(empty, _record([_entry("gelu_forward", 1, 0.0)], device="CPU emulator (sim)", backend="sim"), "sim.json")
    rc, stdout, err = _call(["defaults", "--results", empty, "--out", out])
    assert rc == 2 and err.strip() == (
        f"error: {empty} holds no --trainer-shapes GPU run, but {out} holds the measured defaults of "
        f"{OTHER}, {GPU}; give --results the folder of their runs (or delete the file to write one naming "
        "no GPU); it is left as it is"), err
    assert out.read_bytes() == before
    out.unlink()   # deliberately starting over: a file naming no GPU
    assert _call(["defaults", "--results", empty, "--out", out])[0] == 0
    assert json.loads(out.read_text())["devices"] == {}


def test_a_folder_without_one_gpus_runs_says_its_defaults_are_dropped(results, tmp_path):
    out = tmp_path / "defaults.json"
    assert _call(["defaults", "--results", results, "--out", out])[0] == 0
    (results / "other.json").unlink()   # OTHER's only run
    rc, stdout, err = _call(["defaults", "--results", results, "--out", out])
    assert rc == 0 and sorted(json.loads(out.read_text())["devices"]) == [GPU]
    assert f"note: the defaults of {OTHER} are dropped: {results} holds no --trainer-shapes run of theirs" in err


def test_the_committed_file_is_what_the_committed_results_give():
    # bench/defaults.json is regenerated whenever bench/results gains a GPU run
    rc, stdout, err = _call(["defaults", "--results", defaults.repo_dir() / "bench" / "results",
                             "--out", defaults.repo_dir() / "bench" / "defaults.json", "--check"])
    assert rc == 0, stdout + err


def test_a_bad_results_file_is_named(results, tmp_path):
    (results / "broken.json").write_text("{not json")
    rc, _, err = _call(["defaults", "--results", results, "--out", tmp_path / "d.json"])
    assert rc == 2 and "broken.json" in err and len(err.strip().splitlines()) == 1


def test_the_other_records_of_a_gpu_session_are_skipped_not_fatal(results, tmp_path):
    # a GPU session copies every record of its $OUT/results into bench/results (DEVELOPERS.md): the
    # start-up times (python -m llmcupy.startup writes there by default) and llm.c side by side beside
    # the sweeps. Before, `bench defaults` stopped at the first of them ("not a readable benchmark
    # record ...; move it out") and --list-results called them unreadable.
    startup = {"schema": "llmcupy.startup/1", "backend": "cuda", "device": GPU, "date": "2026-11-02T00:10:00Z",
               "git": {"commit": "b" * 40, "dirty": False}, "cold": {"seconds": 40.0}, "warm": {"seconds": 9.0}}
    (results / "startup-test-gpu-20261102T001000Z.json").write_text(json.dumps(startup))
    (results / "side_by_side.json").write_text(json.dumps({"B": 4, "T": 1024, "gpu": GPU,
                                                           "median_ms_per_step": {"llm.c": 90.0}}))
    out = tmp_path / "defaults.json"
    rc, stdout, err = _call(["defaults", "--results", results, "--out", out])
    assert rc == 0, err
    assert json.loads(out.read_text())["devices"][GPU]["ops"]["layernorm_forward"]["version"] == 3
    assert "ignored side_by_side.json: not a benchmark run" in stdout.replace(f"{results}/", "")
    assert "startup-test-gpu-20261102T001000Z.json: not a benchmark run (schema llmcupy.startup/1)" in stdout
    listing = bench.list_results(results)
    assert "unreadable" not in listing and "llmcupy.startup/1" in listing, listing
    # a record that says it is a benchmark run but is broken is still an error, naming it once
    (results / "cut.json").write_text(json.dumps({"schema": bench.SCHEMA, "date": "2026-11-02T00:00:00Z"}))
    rc, _, err = _call(["defaults", "--results", results, "--out", out])
    assert rc == 2 and err.count("cut.json") == 1 and len(err.strip().splitlines()) == 1, err


# the shape of the shared side-by-side script's side_by_side.json (it has no date, commit or command)
SIDE_BY_SIDE = {"B": 4, "T": 1024, "gpu": f"{GPU}, 580.65.06, 81559 MiB",
                "median_ms_per_step": {"llm.c train_gpt2fp32cu": 90.0, "llmcupy default": 120.0},
                "ratio_to_llmc": {"llm.c train_gpt2fp32cu": 1.0, "llmcupy default": 1.333}}


def _gpu_session_side(tmp_path, stand_in: str):
    """``bash bench/gpu_session.sh side`` in a folder whose .shared/gpu/side_by_side.sh is ``stand_in``;
    pip is skipped (the project is on PYTHONPATH) and the rest runs on this machine."""
    root = tmp_path / "checkout"
    (root / ".shared" / "gpu").mkdir(parents=True)
    (root / ".shared" / "gpu" / "side_by_side.sh").write_text(stand_in)
    python = tmp_path / "python"   # every call but pip's goes to this interpreter
    python.write_text(f'#!/bin/sh\n[ "$1 $2" = "-m pip" ] && exit 0\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("B", "T")}   # the script's, named in "command"
    env.update(OUT=str(out), PYTHON=str(python), LLMCUPY_BACKEND="sim", STEPS="5", PYTHONPATH=str(defaults.repo_dir()))
    proc = subprocess.run(["bash", str(defaults.repo_dir() / "bench" / "gpu_session.sh"), "side"], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300)
    return out, proc.stdout + proc.stderr


def test_gpu_session_records_the_side_by_side_times_with_their_provenance(tmp_path):
    # the side-by-side script writes side_by_side.json with no date, commit or command; before, `side`
    # had it write straight into results/, to be renamed by hand when copied into bench/results (and a
    # later session's replaced it there). Now results/ gets it with its provenance, named by the date.
    stand_in = (f"""mkdir -p "$OUT"; cat > "$OUT/side_by_side.json" <<'EOF'\n{json.dumps(SIDE_BY_SIDE)}\nEOF\n"""
                "echo llm.c 90 ms\n")
    out, log = _gpu_session_side(tmp_path, stand_in)
    records = sorted((out / "results").iterdir())
    assert [p.name for p in records if not p.name.startswith("side_by_side-")] == [], log
    assert len(records) == 1 and re.fullmatch(r"side_by_side-\d{8}T\d{6}Z\.json", records[0].name), log
    record = json.loads(records[0].read_text())
    stamp = records[0].name[len("side_by_side-"):-len(".json")]
    assert record["schema"] == "llmcupy.side_by_side/1" and record["backend"] == "cuda"
    assert record["date"] == (f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]}T{stamp[9:11]}:{stamp[11:13]}:"
                              f"{stamp[13:15]}Z")
    assert record["command"] == "STEPS=5 bash bench/gpu_session.sh side" and record["device"] == GPU
    assert record["git"] == bench.git_commit() and "python" in record["software"] and record["host"]
    assert {k: record[k] for k in SIDE_BY_SIDE} == SIDE_BY_SIDE
    assert "side_by_side: recorded" in (out / "stages.txt").read_text()
    # the script's own files stay beside the stage's log, out of the records
    assert (out / "side_by_side" / "side_by_side.json").exists()
    # in bench/results: another tool's record, named with its date and device
    listing = bench.list_results(out / "results")
    assert listing == (f"{records[0]}: a llmcupy.side_by_side/1 record ({record['date']} {GPU}), not a "
                       "benchmark run"), listing
    rc, stdout, err = _call(["defaults", "--results", out / "results", "--out", tmp_path / "defaults.json"])
    assert rc == 0 and f"{records[0].name}: not a benchmark run (schema llmcupy.side_by_side/1)" in stdout, err


def test_gpu_session_leaves_no_more_files_than_a_device_call_brings_back(tmp_path):
    # A device call brings back at most 8 files from $OUT and leaves the rest behind. The side-by-side
    # script writes a dozen logs beside its JSON, so with the stage's own files `side` left 17 there,
    # and which ones came back (the record among them or not) was the tool's choice. Now the logs are
    # packed into one logs.tar.gz when there are too many, and the record stays a plain file.
    import tarfile

    logs = ["gpu.txt", "install.log", "data.log", "model.log", "llmc_build.log", "llmc.log", "torch_eager.log",
            "torch_compile.log", "llmcupy_default.log", "llmcupy_cuda_graph.log", "llmcupy_matmul4.log"]
    stand_in = (f"""mkdir -p "$OUT"; cat > "$OUT/side_by_side.json" <<'EOF'\n{json.dumps(SIDE_BY_SIDE)}\nEOF\n"""
                + "".join(f'echo {name} > "$OUT/{name}"\n' for name in logs))
    out, log = _gpu_session_side(tmp_path, stand_in)
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert len(files) <= 8, files
    (record,) = [f for f in files if f.startswith("results/")]
    assert json.loads((out / record).read_text())["median_ms_per_step"] == SIDE_BY_SIDE["median_ms_per_step"]
    with tarfile.open(out / "logs.tar.gz") as tar:
        packed = set(tar.getnames())
        assert tar.extractfile("side_by_side/llmc.log").read() == b"llmc.log\n"
    assert {f"side_by_side/{name}" for name in logs + ["side_by_side.json"]} | {"side_by_side.log"} <= packed, packed
    stages = (out / "stages.txt").read_text()
    assert "side_by_side: recorded" in stages and "logs.tar.gz" in stages, stages


def test_gpu_session_side_says_when_the_script_wrote_no_times(tmp_path):
    # the script stopped by its limit (or failed) before it wrote side_by_side.json
    out, log = _gpu_session_side(tmp_path, "echo the llm.c build failed\nexit 1\n")
    assert list((out / "results").iterdir()) == [], log
    stages = (out / "stages.txt").read_text()
    assert (f"side_by_side: nothing recorded: {out}/side_by_side/side_by_side.json is missing or unreadable"
            in stages and "see side_by_side.log" in stages), stages


def test_kernel_choice_follows_the_measured_defaults_and_flags_override_them(results, tmp_path):
    out = tmp_path / "defaults.json"
    assert _call(["defaults", "--results", results, "--out", out])[0] == 0
    choice = KernelChoice()
    assert choice.use_measured(GPU, out) is True and choice.measured_on == GPU
    assert choice.version("layernorm_forward") == 3 and choice.block_size("layernorm_forward") == 512
    assert choice.origin("layernorm_forward") == "measured"
    assert choice.version("gelu_forward") == llmcupy.ops["gelu_forward"].default_version   # not measured there
    assert choice.origin("gelu_forward") == "llm.c" and choice.block_size("gelu_forward") is None
    choice.set("layernorm_forward", 5)                          # a flag
    assert choice.version("layernorm_forward") == 5 and choice.block_size("layernorm_forward") is None
    assert choice.origin("layernorm_forward") == "chosen"
    # another GPU, or a GPU the file does not name
    other = KernelChoice()
    assert other.use_measured(OTHER, out) and other.version("gelu_forward") == 1
    assert not KernelChoice().use_measured("NVIDIA Unmeasured", out)
    text = defaults.provenance(out)
    assert GPU in text and OTHER in text and "layernorm_forward 3" in text
    assert "not measured there (llm.c's choice)" in text and "adamw" in text


def test_measured_fusion_versions_apply_when_fusions_are_selected(tmp_path):
    doc = {"schema": defaults.SCHEMA, "devices": {GPU: {"source": "x", "date": "d", "commit": "c", "ops": {
        "fused_residual_forward": {"version": 1, "block_size": 128}}}}}
    path = defaults.write(doc, tmp_path / "d.json")
    choice = KernelChoice()
    choice.use_measured(GPU, path)
    assert not choice.uses("fused_residual_forward")            # a measurement does not turn a fusion on
    choice.select_fusions()
    assert choice.version("fused_residual_forward") == 1 and choice.block_size("fused_residual_forward") == 128


@pytest.mark.parametrize("ops,why", [
    ({"layernorm_forward": {"version": 99}}, "is not in this catalogue"),
    ({"encoder_backward": {"version": 1}}, "is nondeterministic"),
])
def test_a_measured_version_the_catalogue_cannot_run_is_an_error(tmp_path, ops, why):
    path = defaults.write({"schema": defaults.SCHEMA, "devices": {GPU: {"ops": ops}}}, tmp_path / "d.json")
    with pytest.raises(defaults.DefaultsError, match=why) as exc:
        KernelChoice().use_measured(GPU, path)
    assert str(path) in str(exc.value) and "--kernel-defaults catalogue" in str(exc.value)


@pytest.mark.parametrize("text", ["{", "[]", '{"schema": "other", "devices": {}}',
                                  '{"schema": "llmcupy.defaults/1", "devices": {"G": {"ops": {"x": {}}}}}'])
def test_a_malformed_defaults_file_is_refused_with_its_name(tmp_path, text):
    path = tmp_path / "d.json"
    path.write_text(text)
    with pytest.raises(defaults.DefaultsError, match="regenerate it") as exc:
        defaults.load(path)
    assert str(path) in str(exc.value)


def test_trainer_shapes_need_a_gpu():
    rc, _, err = _call(["--trainer-shapes", "--backend", "sim", "--no-save", "--no-progress"])
    assert rc == 2 and "run it on a GPU" in err
    rc, _, err = _call(["--trainer-shapes", "--ops", "softmax_forward", "--backend", "sim", "--no-save"])
    assert rc == 2 and "not an op of the training step" in err


@pytest.mark.gpu
def test_a_trainer_shapes_run_on_a_gpu_gives_defaults_for_it(tmp_path):
    from llmcupy.runtime import backend

    llmcupy.set_backend("cuda")
    try:
        record = bench.run(["layernorm_forward", "gelu_forward"], trainer=True, repeat=5, progress=False,
                           log=io.StringIO())
        assert record["sizes"] == "trainer" and record["timed"]
        path = bench.save(record, tmp_path / "results")
        doc = defaults.derive(path.parent)
        entry = doc["devices"][backend.device_name()]
        for op in ("layernorm_forward", "gelu_forward"):
            chosen = entry["ops"][op]
            passed = [r for r in record["results"] if r["op"] == op and r["ok"] is True and r.get("best")]
            assert chosen["ms"] == min(r["best"]["ms"] for r in passed
                                       if llmcupy.ops[op].versions[r["version"]].deterministic)
        out = defaults.write(doc, tmp_path / "defaults.json")
        choice = KernelChoice()
        assert choice.use_measured(backend.device_name(), out)
        assert choice.version("layernorm_forward") == entry["ops"]["layernorm_forward"]["version"]
    finally:
        llmcupy.set_backend("sim")


# ----------------------------------------------------------------------------------------------
# TF32: the defaults are measured as the trainer runs its GEMMs


def test_the_benchmark_measures_the_trainer_shapes_with_the_trainers_tf32_default():
    from llmcupy import train

    trainer_default = train.build_parser().parse_args([]).tf32
    assert bool(trainer_default) == defaults.TRAINER_TF32
    assert bench.default_tf32(trainer=True) == defaults.TRAINER_TF32
    assert bench.default_tf32(trainer=False) is False   # a catalogue sweep keeps the FP32 tolerances


def test_runs_measured_at_the_other_tf32_setting_are_left_out_and_named(tmp_path):
    d = tmp_path / "results"
    other = not defaults.TRAINER_TF32
    # newer, but at the other setting: its cuBLAS times are not what the trainer gets
    _save(d, _record([_entry("matmul_forward", 5, 0.10), _entry("matmul_forward", 2, 0.50)],
                     date="2026-11-03T00:00:00Z", tf32=other), "other_setting.json")
    _save(d, _record([_entry("matmul_forward", 5, 0.30), _entry("matmul_forward", 2, 0.05)]), "trainer_setting.json")
    legacy = _record([_entry("gelu_forward", 1, 0.02)], device=OTHER)
    del legacy["tf32"]   # recorded before bench set TF32: plain FP32 GEMMs
    _save(d, legacy, "legacy.json")
    out = tmp_path / "defaults.json"
    rc, stdout, err = _call(["defaults", "--results", d, "--out", out])
    assert rc == 0, err
    doc = json.loads(out.read_text())
    entry = doc["devices"][GPU]
    assert entry["source"].endswith("trainer_setting.json") and entry["tf32"] is defaults.TRAINER_TF32
    assert entry["ops"]["matmul_forward"]["version"] == 2
    assert (OTHER in doc["devices"]) == (defaults.TRAINER_TF32 is False)
    assert "ignored" not in doc and "TF32" in doc["rule"]
    assert "other_setting.json: measured with TF32" in stdout
    assert ("legacy.json: measured with TF32" in stdout) == defaults.TRAINER_TF32


def test_the_tf32_setting_reaches_the_child_that_runs_each_version(monkeypatch):
    """In the emulator TF32 never takes effect (no cuBLAS, no tensor cores): pretend an sm_80+ GPU so that
    the forked child running each version shows the setting it was given, and the harness applies the
    TF32 tolerance to the versions that called cuBLAS (2 and 3), not to the FP32 kernels."""
    from llmcupy.runtime import blas

    monkeypatch.setattr(blas, "_tf32_capable", lambda: True)
    rec = bench.run(["matmul_forward"], tf32=True, isolate=True, analyze=False, progress=False, log=io.StringIO())
    assert rec["tf32"] is True and rec["ops"]["matmul_forward"]["tf32_tolerance"] == {"out": [0.1, 2.0 ** -10]}
    assert all(e["ok"] is True and e["tf32"] is True for e in rec["results"]), rec["results"]
    for e in rec["results"]:
        tf32_blocks = [b for b in e["blocks"] if b.get("tolerance") == "tf32"]
        if e["version"] in (2, 3):
            assert tf32_blocks and len(tf32_blocks) == len(e["blocks"])
            assert all(b["errors"]["out"]["atol"] == 0.1 for b in tf32_blocks)
        else:
            assert not tf32_blocks and all(b["errors"]["out"]["atol"] == 1e-3 for b in e["blocks"])
    assert blas.tf32_enabled() is False   # the setting was the child's, and scoped there
    rec = bench.run(["matmul_forward"], tf32=False, isolate=True, analyze=False, progress=False, log=io.StringIO())
    assert rec["tf32"] is False and all(e["tf32"] is False for e in rec["results"])
    assert not any(b.get("tolerance") for e in rec["results"] for b in e["blocks"])


def test_the_tf32_flag_is_recorded_and_never_in_effect_in_the_emulator(tmp_path):
    rc, stdout, err = _call(["--ops", "gelu_forward", "--tf32", "1", "--no-progress", "--no-analyze",
                             "--out", tmp_path])
    assert rc == 0, err
    rec = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert rec["tf32"] is True and all(e["tf32"] is False for e in rec["results"])
    rc, _, err = _call(["--ops", "gelu_forward", "--tf32", "2", "--no-save"])
    assert rc == 2 and "--tf32" in err
