"""What a new user meets at the command line: reproducible defaults, Ctrl-C during a save, resuming,
using a trained model elsewhere, one-line errors with one exit-code rule, and the hints.

Every input is made here (``gen_inputs``); the CLIs' ``main(argv)`` run in-process (the same code
path as ``python -m``), in the emulator.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gen_inputs
from llmcupy import checkpoint as ckpt
from llmcupy.config import GPT2Config, init_params
from _helpers import run_cli

REPO = Path(__file__).resolve().parents[1]
STEP_LINE = re.compile(r"^step +(\d+)/(\d+): train loss ([0-9.]+) ", re.M)
SMALL = ["--init", "d1", "-b", 2, "-t", 32]          # the default kernels on the smallest preset


_call = run_cli   # (exit code, stdout, stderr) of an in-process CLI call


def _train(argv):
    from llmcupy import train

    return _call(train.main, argv)


def _losses(stdout: str) -> dict[int, str]:
    """step -> the loss exactly as printed."""
    return {int(m.group(1)): m.group(3) for m in STEP_LINE.finditer(stdout)}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    bpe = gen_inputs.write_tiny_bpe(d / "tiny.tiktoken")
    train, val = gen_inputs.write_token_files(d, bpe, n_sections=60, val_sections=24)
    return {"dir": d, "bpe": bpe, "train": train, "val": val, "data": ["-i", train, "-j", val]}


# ---------------------------------------------------------------------------------------------
# reproducible defaults, Ctrl-C during a save, resume


def test_two_runs_of_the_default_configuration_print_identical_losses(inputs):
    from llmcupy import ops

    argv = SMALL + ["--steps", 4, "-v", 0, "-s", 0] + inputs["data"]
    rc, out1, err = _train(argv)
    assert rc == 0, err
    rc, out2, err = _train(argv)
    assert rc == 0, err
    assert len(_losses(out1)) == 4 and _losses(out1) == _losses(out2)
    # no step op defaults to a version that adds with fp32 atomics in a varying order
    from llmcupy.model import STEP_OPS

    for name in STEP_OPS:
        op = ops.get(name)
        assert op.versions[op.default_version].deterministic, name
    assert not ops.get("encoder_backward").versions[1].deterministic


def test_nondeterministic_versions_are_marked_in_the_list():
    from llmcupy import kernel, ops

    text = ops.get("encoder_backward").describe()
    assert re.search(r"^ +1 .*\[nondeterministic", text, re.M) and re.search(r"^ \* +2 ", text, re.M), text
    rc, out, _ = _call(kernel.main, ["--list"])
    assert rc == 0 and out.count("[nondeterministic") >= 10


def test_kill_during_a_save_then_resume_equals_an_uninterrupted_run(inputs, tmp_path, monkeypatch):
    common = SMALL + ["--steps", 6, "-v", 2, "-m", 1, "-s", 0, "--save-every", 2] + inputs["data"]
    full_state, full_log = tmp_path / "full.npz", tmp_path / "full.log"
    rc, full_out, err = _train(common + ["--save-path", full_state, "-o", full_log])
    assert rc == 0, err

    state, log = tmp_path / "state.npz", tmp_path / "run.log"
    real_save = ckpt.save_training_state
    seen_log = []

    def save_interrupted_at_4(path, st):
        if st.step == 4:
            seen_log.append(log.read_text())          # what a kill now would leave in the log
            os.kill(os.getpid(), signal.SIGINT)       # Ctrl-C while the file is being written
        real_save(path, st)

    monkeypatch.setattr(ckpt, "save_training_state", save_interrupted_at_4)
    rc, out, err = _train(common + ["--save-path", state, "-o", log])
    monkeypatch.setattr(ckpt, "save_training_state", real_save)
    assert rc == 130, out + err
    assert f"interrupted while saving step 4 (the save completed: --resume {state}" in err, err
    assert "saved the training state at step 4" in out
    assert "step    5/6" not in out                     # acted on right after the save
    assert ckpt.load_training_state(state).step == 4    # the save completed
    # every log line printed before the save was on disk (flushed per line)
    assert seen_log and "s:3 trl:" in seen_log[0]

    # a kill mid-save leaves a hidden temporary: the next run removes it
    stale = tmp_path / ".state.npz.k1ll3d.tmp"
    stale.write_bytes(b"\0" * 4096)
    # resume from the state alone: no -e/--init (the state holds the model)
    resume = [a for a in common if a not in ("--init", "d1")]
    rc, out2, err = _train(resume + ["--save-path", state, "-o", log, "--resume", state])
    assert rc == 0, err
    assert not stale.exists() and "left by an interrupted save" in out2
    # the same losses, step for step, and the same final state, bit for bit
    assert sorted(_losses(full_out)) == [1, 2, 3, 4, 5, 6]   # (no step line matched: {} == {} passed)
    assert {**_losses(out), **_losses(out2)} == _losses(full_out)
    a, b = ckpt.load_training_state(state), ckpt.load_training_state(full_state)
    assert a.step == b.step == 6
    for name in ("params", "m", "v"):
        assert getattr(a, name).tobytes() == getattr(b, name).tobytes(), name
    # the log continues without a gap or a repeat
    assert log.read_text() == full_log.read_text()


def test_a_resumed_log_survives_a_failure_while_it_is_rewritten(tmp_path, monkeypatch):
    # A resumed run keeps the -o log's lines before its step and drops the later ones. Before, the log
    # was opened with truncation and the kept lines written back after: a Ctrl-C, a kill or a full
    # disk in between left an empty log, the interrupted run's lines lost.
    import builtins
    import errno

    from llmcupy import fileio, train

    kept = "s:0 tel:4.0000\ns:0 trl:4.1000\ns:1 trl:3.9000\n"
    old = kept + "s:2 trl:3.8000\ns:3 trl:3.7000\n"
    log = tmp_path / "train.log"
    log.write_text(old)

    def interrupted_after_opening(file, mode="r", *args, **kwargs):
        f = builtins.open(file, mode, *args, **kwargs)
        if os.fspath(file) == str(log) and mode[0] in "wa":
            f.close()
            raise KeyboardInterrupt   # right after the log is opened for writing
        return f

    monkeypatch.setattr(train, "open", interrupted_after_opening, raising=False)
    with pytest.raises(KeyboardInterrupt):
        train.Logger(str(log), resume_step=2)
    assert log.read_text().startswith(kept)
    monkeypatch.undo()

    def full_disk(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    log.write_text(old)
    monkeypatch.setattr(fileio.os, "fsync", full_disk)   # the kept lines do not reach the disk
    with pytest.raises(OSError, match="No space left on device") as failed:
        train.Logger(str(log), resume_step=2)
    assert failed.value.filename == str(log)          # named, for the CLI's one-line error
    assert log.read_text() == old and [p.name for p in tmp_path.iterdir()] == ["train.log"]
    monkeypatch.undo()

    # the resumed run writes after the kept lines; a log behind a symlink stays behind it
    target = tmp_path / "logs" / "real.log"
    target.parent.mkdir()
    target.write_text(old)
    link = tmp_path / "link.log"
    link.symlink_to(target)
    for path in (log, link):
        logger = train.Logger(str(path), resume_step=2)
        logger.log(2, "trl", 3.75)
        logger.close()
        assert path.read_text() == kept + "s:2 trl:3.7500\n"
    assert link.is_symlink()


@pytest.mark.parametrize("kill", ["SIGTERM", "SIGKILL"])
def test_a_log_rewrite_killed_leaves_no_temporary_beyond_the_next_run(tmp_path, kill, capsys):
    # A resumed run rewrites the -o log through a hidden temporary beside it. A Ctrl-C removes it; a
    # SIGTERM (Python's default: no unwinding) or a SIGKILL in the middle left it in the output folder,
    # and no later run removed it. Now the next run that opens the log removes it, saying so.
    from llmcupy import train

    kept = "s:0 trl:4.1000\ns:1 trl:3.9000\n"
    old = kept + "s:2 trl:3.8000\n"
    log = tmp_path / "main.log"
    log.write_text(old)
    killed_mid_write = ("import os, signal, sys\n"
                        "from llmcupy import train\n"
                        f"os.fsync = lambda fd: os.kill(os.getpid(), signal.{kill})   # the kept lines written\n"
                        "train.Logger(sys.argv[1], resume_step=2)\n")
    proc = subprocess.run([sys.executable, "-c", killed_mid_write, str(log)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "LLMCUPY_BACKEND": "sim"})
    assert proc.returncode == -getattr(signal, kill), proc.stderr
    stray = [p for p in tmp_path.iterdir() if p != log]
    assert len(stray) == 1 and stray[0].name.startswith(".main.log.") and log.read_text() == old
    for resume_step in (2, None):   # resumed again, or started afresh: either run removes it
        (tmp_path / stray[0].name).write_text(kept)
        capsys.readouterr()
        logger = train.Logger(str(log), resume_step=resume_step)
        logger.close()
        assert [p.name for p in tmp_path.iterdir()] == ["main.log"], resume_step
        out = capsys.readouterr().out
        assert out.startswith(f"removed {stray[0]} (") and out.endswith("left by an interrupted save\n"), out
        assert log.read_text() == (kept if resume_step else "")   # resumed: the lines before step 2


def test_resume_refuses_a_model_that_disagrees_with_the_state(inputs, tmp_path):
    state = tmp_path / "s.npz"
    rc, _, err = _train(SMALL + ["--steps", 1, "-v", 0, "-s", 0, "--save-every", 1, "--save-path", state]
                        + inputs["data"])
    assert rc == 0, err
    rc, _, err = _train(["--init", "d2", "--resume", state, "--steps", 2, "-b", 2, "-t", 32] + inputs["data"])
    assert rc == 2 and "must agree" in err and "--init d2" in err, err
    # another batch shape said "cannot resume this run from it (ValueError: data loader state does not
    # match this loader: B is 2 in the state, 4 here)", naming neither flag nor what to do
    rc, out, err = _train(["--resume", state, "--steps", 2, "-b", 4, "-v", 0, "-s", 0] + inputs["data"])
    assert rc == 2 and err == (f"error: --resume {state} continues a run at -b 2 -t 32, not -b 4: leave out -b "
                               "and -t (a resumed run keeps the state's batch shape)\n"), err
    assert "allocated" not in out, out
    rc, out, err = _train(SMALL + ["--resume", state, "--steps", 2, "-v", 0, "-s", 0] + inputs["data"])
    assert rc == 0 and f"resumed from {state} at step 1" in out, err
    # the state alone: model, and B and T of its data position (the defaults, T = 1024, would not fit d1)
    rc, out, err = _train(["--resume", state, "--steps", 2, "-v", 0, "-s", 0] + inputs["data"])
    assert rc == 0 and f"resumed from {state} at step 1" in out and "step    2/2" in out, err
    assert re.search(r"\| batch size B\s+\| 2 ", out) and re.search(r"\| sequence length T\s+\| 32 ", out), out


def test_resume_with_the_original_model_flag_says_the_state_s_weights_are_used(inputs, tmp_path):
    # The common way to resume: the original command with --resume added. Its -e (or --init) agrees
    # with the state's shape, and the state's weights are the ones trained on; before, the -e file
    # was read, checked and then dropped without a word, as if the run started from it.
    cfg = GPT2Config.preset("d1")
    model = tmp_path / "start.bin"
    ckpt.write_model(model, cfg, init_params(cfg, seed=7))
    state = tmp_path / "s.npz"
    common = ["-b", 2, "-t", 32, "-v", 0, "-s", 0] + inputs["data"]
    rc, _, err = _train(["-e", model, "--steps", 1, "--save-every", 1, "--save-path", state] + common)
    assert rc == 0, err
    for flag in (["-e", model], ["--init", "d1"]):
        rc, out, err = _train(flag + ["--resume", state, "--steps", 2] + common)
        assert rc == 0, err
        notes = [line for line in out.splitlines() if line.startswith("note:")]
        assert notes == [f"note: the weights come from --resume {state} (step 1); {flag[0]} {flag[1]} is not "
                         "used"], out
        assert f"resumed from {state} at step 1" in out
    rc, out, err = _train(["--resume", state, "--steps", 2] + common)   # the state alone: nothing to say
    assert rc == 0 and "note:" not in out, out + err


def test_resume_of_a_file_that_is_not_a_state_says_so_without_pickle(inputs, tmp_path):
    model = tmp_path / "model.bin"
    cfg = GPT2Config.preset("d1")
    ckpt.write_model(model, cfg, init_params(cfg))
    rc, _, err = _train(["--resume", model] + inputs["data"])
    assert rc == 2 and "pickle" not in err.lower(), err
    assert "llm.c model file" in err and "-e" in err and "--save-every" in err, err
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"hello, not a zip" * 10)
    rc, _, err = _train(["--resume", junk] + inputs["data"])
    assert rc == 2 and "not a zip archive" in err and "pickle" not in err.lower(), err


# ---------------------------------------------------------------------------------------------
# a trained model, used elsewhere


@pytest.fixture(scope="module")
def trained_state(inputs, tmp_path_factory):
    state = tmp_path_factory.mktemp("trained") / "state.npz"
    rc, _, err = _train(SMALL + ["--steps", 2, "-v", 0, "-s", 0, "--save-every", 2, "--save-path", state]
                        + inputs["data"])
    assert rc == 0, err
    return state


def test_sample_profile_and_gate_take_a_training_state(inputs, trained_state, tmp_path):
    from llmcupy import profile, sample, test_gpt2

    rc, out, err = _call(sample.main, ["-e", trained_state, "-n", 3, "-t", 16, "--bpe", inputs["bpe"],
                                       "--prompt", "ROMEO:"])
    assert rc == 0, err
    assert out.startswith("ROMEO:")
    rc, out, err = _call(profile.main, ["-e", trained_state, "-b", 1, "-t", 16, "--random-data"])
    assert rc == 0, err
    assert "training state at step 2" in out
    # the gate reads the weights from the state (a made-up reference: it runs and reports, rc 1)
    st = ckpt.load_training_state(trained_state)
    cfg, B, T = st.config, 1, 8
    debug = tmp_path / "debug.bin"
    ckpt.write_debug_state(debug, np.zeros((B, T), np.int32), np.ones((B, T), np.int32),
                           np.zeros((B, T, cfg.vocab_size), np.float32), 10.8, np.zeros(st.params.size, np.float32))
    rc, out, err = _call(test_gpt2.main, ["-e", trained_state, "-d", debug, "--steps", 1])
    assert rc == 1 and "overall okay: 0" in out, err


def test_convert_writes_the_llmc_model_and_a_hugging_face_export(trained_state, tmp_path):
    from safetensors.numpy import load_file

    from llmcupy import convert

    st = ckpt.load_training_state(trained_state)
    out_bin, out_st = tmp_path / "trained.bin", tmp_path / "hf" / "model.safetensors"
    rc, out, err = _call(convert.main, [trained_state, "-o", out_bin, "--safetensors", out_st])
    assert rc == 0, err
    cfg, params = ckpt.read_model(out_bin)
    assert cfg == st.config and params.tobytes() == st.params.tobytes()
    tensors = load_file(str(out_st))
    C, L = cfg.channels, cfg.num_layers
    assert tensors["wte.weight"].shape == (cfg.vocab_size, C)          # unpadded, as Hugging Face has it
    assert tensors["h.0.attn.c_attn.weight"].shape == (C, 3 * C)       # Conv1D layout (in, out)
    assert len([k for k in tensors if k.startswith(f"h.{L - 1}.")]) == 12
    assert (out_st.parent / "config.json").is_file()
    # and back: the importer reads the export to the same parameters (padding rows are zero either way)
    back = tmp_path / "back.bin"
    rc, _, err = _call(convert.main, [out_st, "-o", back])
    assert rc == 0, err
    cfg2, params2 = ckpt.read_model(back)
    wte = ckpt.split_params(params, cfg)["wte"]
    assert cfg2 == cfg
    expected = params.copy()
    ckpt.split_params(expected, cfg)["wte"][cfg.vocab_size:] = 0
    assert np.array_equal(params2, expected) and not wte[cfg.vocab_size:].any()


# ---------------------------------------------------------------------------------------------
# one-line errors, one exit-code rule: every CLI, every bad-file class


def _bad(kind: str, good: Path, tmp_path: Path) -> Path:
    if kind == "missing":
        return tmp_path / f"missing_{good.name}"
    if kind == "folder":
        d = tmp_path / f"folder_{good.name}"
        d.mkdir(exist_ok=True)
        return d
    data = good.read_bytes()
    bad = tmp_path / f"{kind}_{good.name}"
    if kind == "truncated":
        bad.write_bytes(data[:len(data) // 2])
    else:   # wrong magic
        bad.write_bytes(b"\x13\x37\x00\x00" + data[4:])
    return bad


@pytest.fixture(scope="module")
def good_files(inputs, trained_state, tmp_path_factory):
    from llmcupy import tokenizer as tk

    d = tmp_path_factory.mktemp("good")
    cfg = GPT2Config.preset("d1")
    model = d / "model.bin"
    ckpt.write_model(model, cfg, init_params(cfg))
    tok = d / "tokenizer.bin"
    tk.write_tokenizer(tok, tk.get_encoding(inputs["bpe"]))
    return {"model": model, "state": trained_state, "tokens": inputs["train"], "tokenizer": tok,
            "bpe": inputs["bpe"]}


def _cli(name):
    import importlib

    return importlib.import_module(f"llmcupy.{name}").main


# (CLI, the file it reads, argv with {} for that file)
CASES = [
    ("train", "model", SMALL[2:] + ["-e", "{}", "--steps", 1, "-v", 0, "-s", 0, "-i", "{tokens}"]),
    ("train", "tokens", SMALL + ["--steps", 1, "-v", 0, "-s", 0, "-i", "{}"]),
    ("train", "state", SMALL[2:] + ["--resume", "{}", "--steps", 3, "-v", 0, "-s", 0, "-i", "{tokens}"]),
    ("train", "tokenizer", SMALL + ["--steps", 1, "-v", 0, "-s", 1, "-g", 2, "--tokenizer", "{}", "-i", "{tokens}"]),
    ("sample", "model", ["-e", "{}", "-n", 1, "-t", 8, "--bpe", "{bpe}"]),
    ("sample", "state", ["-e", "{}", "-n", 1, "-t", 8, "--bpe", "{bpe}"]),
    ("profile", "model", ["-e", "{}", "-b", 1, "-t", 8, "--random-data"]),
    ("profile", "tokens", ["--init", "d1", "-b", 1, "-t", 8, "-i", "{}"]),
    ("test_gpt2", "model", ["-e", "{}", "-d", "{model}"]),
    ("convert", "model", ["{}", "-o", "{out}"]),
    ("convert", "state", ["{}", "-o", "{out}"]),
    ("torch_gpt2", "model", ["--model", "{}", "--out-model", "{out}", "--out-state", "{out}.state"]),
    ("torch_gpt2", "tokens", ["--init", "d1", "--data", "{}", "--out-model", "{out}", "--out-state", "{out}.s"]),
]


@pytest.mark.parametrize("kind", ["missing", "folder", "truncated", "magic"])
@pytest.mark.parametrize("cli,which,argv", CASES, ids=[f"{c}-{w}" for c, w, _ in CASES])
def test_every_cli_reports_a_bad_file_in_one_line_with_exit_2(cli, which, argv, kind, good_files, tmp_path):
    if cli == "torch_gpt2":
        pytest.importorskip("torch")
    bad = _bad(kind, good_files[which], tmp_path)
    subst = {f"{{{k}}}": str(v) for k, v in good_files.items()} | {"{out}": str(tmp_path / "out.bin")}
    args = [str(bad) if a == "{}" else subst.get(str(a), a) for a in argv]
    # any exception but SystemExit (a traceback) fails the test here
    rc, out, err = _call(_cli(cli), args)
    assert rc == 2, f"rc {rc}\n{out[-1500:]}\n{err}"
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and bad.name in errors[0], err
    assert "Traceback" not in err and not (tmp_path / "out.bin").exists()


@pytest.mark.parametrize("cli,argv", [
    ("data", ["tinyshakespeare", "--bpe", "{}", "--input", "{text}", "--out", "{out}"]),
    ("tokenizer", ["--bpe", "{}", "-o", "{out}"]),
    ("sample", ["--init", "d1", "-n", 1, "--bpe", "{}"]),
    ("train", SMALL + ["--steps", 1, "-v", 0, "-s", 1, "-g", 2, "--bpe", "{}", "-i", "{tokens}"]),
])
@pytest.mark.parametrize("kind", ["missing", "folder", "truncated"])
def test_bad_bpe_files_are_one_line_errors(cli, argv, kind, good_files, tmp_path, monkeypatch):
    monkeypatch.delenv("LLMCUPY_GPT2_BPE", raising=False)
    text = tmp_path / "t.txt"
    text.write_text(gen_inputs.make_text(5))
    bad = _bad(kind, good_files["bpe"], tmp_path)
    subst = {"{text}": str(text), "{out}": str(tmp_path / "out"), "{tokens}": str(good_files["tokens"])}
    rc, out, err = _call(_cli(cli), [str(bad) if a == "{}" else subst.get(str(a), a) for a in argv])
    assert rc == 2, f"rc {rc}\n{out[-1500:]}\n{err}"
    assert err.startswith("error: ") and bad.name in err and "Traceback" not in err, err


def test_missing_default_model_is_exit_2_everywhere_with_the_real_paths(inputs, tmp_path, monkeypatch):
    from llmcupy import profile, sample, train

    monkeypatch.chdir(tmp_path)
    for main, argv in ((train.main, inputs["data"]), (profile.main, ["--random-data"]), (sample.main, [])):
        rc, _, err = _call(main, argv)
        assert rc == 2 and "no model file 'gpt2_124M.bin'" in err, err
        assert "python -m llmcupy.convert data/gpt2/model.safetensors -o gpt2_124M.bin" in err, err


def test_missing_training_state_says_how_the_trainer_writes_one(inputs, tmp_path, monkeypatch):
    """The README's `sample -e llmcupy_train_state.npz` before any run saved a state: the advice was
    GPT-2 124M's download and convert, which write a .bin, not the state the command names."""
    from llmcupy import profile, sample, train

    monkeypatch.chdir(tmp_path)
    state = ["-e", "llmcupy_train_state.npz"]
    for main, argv in ((train.main, state + inputs["data"]), (profile.main, state + ["--random-data"]),
                       (sample.main, state)):
        rc, _, err = _call(main, argv)
        assert rc == 2 and "no training state 'llmcupy_train_state.npz'" in err, err
        assert "--save-path llmcupy_train_state.npz" in err and "llmcupy.download" not in err, err


# ---------------------------------------------------------------------------------------------
# training input


def test_a_token_id_outside_the_vocabulary_is_named_by_file_and_offset(tmp_path):
    from llmcupy.data import write_tokens

    tokens = np.arange(2000) % 1000
    tokens[1234] = 60000
    path = tmp_path / "bad_ids.bin"
    write_tokens(path, tokens)
    rc, out, err = _train(SMALL + ["--steps", 1, "-v", 0, "-s", 0, "-i", path])
    assert rc == 2 and "step" not in out.split("kernel versions:")[-1], out
    assert f"{path}: token id 60000 at token 1234 (byte offset {1024 + 2 * 1234})" in err, err


def test_a_corrupt_tokenizer_named_explicitly_is_an_error(inputs, tmp_path):
    bad = tmp_path / "tok.bin"
    bad.write_bytes(b"\0" * 3000)
    rc, out, err = _train(SMALL + ["--steps", 1, "-v", 0, "-s", 1, "--tokenizer", bad] + inputs["data"])
    assert rc == 2 and "tok.bin" in err and "step    1" not in out, err
    assert "python -m llmcupy.tokenizer" in err, err   # the command that writes one


def test_a_nan_in_the_starting_model_is_refused_without_claiming_a_saved_state(inputs, tmp_path):
    cfg = GPT2Config.preset("d1")
    params = init_params(cfg)
    params[5] = np.nan
    model = tmp_path / "nan.bin"
    ckpt.write_model(model, cfg, params)
    rc, _, err = _train(["-e", model, "-b", 2, "-t", 32, "--steps", 1] + inputs["data"])
    assert rc == 2 and "NaN or infinite" in err and "last good state" not in err, err


def test_sample_prints_a_bf16_model_warning_in_one_line(tmp_path, monkeypatch):
    # Python's format printed llmcupy's source path and line, then "  config, params = read_model(path)"
    from llmcupy import sample
    from llmcupy.tokenizer import Tokenizer

    monkeypatch.chdir(tmp_path)
    Tokenizer([b"a"] * 50257).save("gpt2_tokenizer.bin")
    cfg = GPT2Config.preset("d1")
    ckpt.write_model("bf16.bin", cfg, init_params(cfg), dtype="bf16")
    rc, out, err = _call(sample.main, ["-e", "bf16.bin", "-n", 1, "-t", 8])
    assert rc == 0 and err == ("warning: bf16.bin: model file version 5 holds bf16 parameters; converted to fp32 "
                               "(the values keep bf16 precision)\n"), err


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_sample_and_convert_refuse_a_model_with_nan_or_inf_weights(tmp_path, monkeypatch, bad):
    # sample printed "<|endoftext|>" for every token with exit 0 (NaN logits select none, so the
    # sampler falls back to the last id), and convert wrote the broken weights on without a word
    from llmcupy import convert, sample
    from llmcupy.tokenizer import Tokenizer

    monkeypatch.chdir(tmp_path)
    Tokenizer([b"a"] * 50257).save("gpt2_tokenizer.bin")   # sample's decoder, found in the working folder
    cfg = GPT2Config.preset("d1")
    params = init_params(cfg)
    params[[7, 9]] = bad
    model = tmp_path / "bad.bin"
    ckpt.write_model(model, cfg, params)
    rc, out, err = _call(sample.main, ["-e", model, "-n", 2, "-t", 8])
    assert rc == 2 and err == f"error: {model}: 2 of its parameters are NaN or infinite (the first in wte); it " \
        "cannot be trained or sampled. Start from an earlier checkpoint or from --init\n", err
    assert out == ""
    out_file = tmp_path / "out.bin"
    rc, out, err = _call(convert.main, [model, "-o", out_file])
    assert rc == 2 and f"error: {model}: 2 of its parameters are NaN or infinite (the first in wte)" in err, err
    assert not out_file.exists()


def test_a_nonfinite_loss_exits_3_and_says_where_the_last_state_is(inputs, tmp_path, monkeypatch):
    from llmcupy import model as model_mod

    real = model_mod.GPT2.train_step   # the eager step's one loss read
    calls = []

    def train_step(self, *args):
        loss = real(self, *args)
        calls.append(1)
        return float("nan") if len(calls) == 3 else loss

    monkeypatch.setattr(model_mod.GPT2, "train_step", train_step)
    state = tmp_path / "s.npz"
    rc, _, err = _train(SMALL + ["--steps", 4, "-v", 0, "-s", 0, "--save-every", 2, "--save-path", state]
                        + inputs["data"])
    assert rc == 3 and "train loss is nan at step 3" in err, err
    assert f"the last state saved is in {state}, at step 2" in err and "good" not in err, err


def test_no_validation_needs_no_val_file(inputs, tmp_path):
    rc, out, err = _train(SMALL + ["--steps", 1, "-v", 0, "-s", 0, "-i", inputs["train"], "-j", tmp_path / "none.bin"])
    assert rc == 0, err
    assert "val loss" not in out


def test_train_help_gives_a_real_kernel_example():
    from llmcupy import train

    text = train.build_parser().format_help()
    assert "--kernel attention_backward=7" in " ".join(text.split()) and "softmax..." not in text
    assert "--bpe" in text


# ---------------------------------------------------------------------------------------------
# the kernel CLI's edges


def _kernel(*argv):
    from llmcupy import kernel

    return _call(kernel.main, list(argv))


def test_kernel_cli_echoes_a_bad_version():
    rc, _, err = _kernel("softmax_forward", "abc")
    assert rc == 2 and "softmax_forward has no version 'abc'" in err, err


def test_kernel_cli_unavailable_version_or_refused_sizes_exit_2_with_the_reason():
    rc, out, err = _kernel("layernorm_backward", "4")
    assert rc == 2 and "did not run" in err and "bf16 only" in err, out + err
    rc, out, err = _kernel("matmul_backward_bias", "4", "--OC", "33")
    assert rc == 2 and "did not run" in err, out + err


def _run_cli(args, **env):
    proc = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO), LLMCUPY_BACKEND="sim", **env))
    return proc.returncode, proc.stdout, proc.stderr


def test_kernel_cli_without_a_compiler_is_one_line_exit_2(tmp_path):
    rc, out, err = _run_cli(["llmcupy.kernel", "softmax_forward", "5"], CXX=str(tmp_path / "no-g++"),
                            LLMCUPY_CACHE_DIR=str(tmp_path))
    assert rc == 2, out + err
    assert "Traceback" not in err and err.strip().count("\n") == 0 and "C++17 compiler" in err, err


def test_train_and_sample_without_a_compiler_are_one_line_exit_2(inputs, tmp_path):
    no_cxx = dict(CXX=str(tmp_path / "no-g++"), LLMCUPY_CACHE_DIR=str(tmp_path))
    for args in (["llmcupy.train", "--init", "d1", "-b", "2", "-t", "32", "--steps", "1", "-v", "0", "-s", "0",
                  "-i", str(inputs["train"])],
                 ["llmcupy.sample", "--init", "d1", "-n", "1", "-t", "8", "--bpe", str(inputs["bpe"])]):
        rc, out, err = _run_cli(args, **no_cxx)
        assert rc == 2, out + err
        assert "Traceback" not in err and err.startswith("error: the emulator needs a C++17 compiler"), err


def test_compile_report_without_nvrtc_is_one_line_exit_2(tmp_path):
    rc, out, err = _run_cli(["llmcupy.kernel", "--compile-report", "softmax_forward"],
                            LLMCUPY_NVRTC=str(tmp_path / "libnvrtc.so"))
    assert rc == 2, out + err
    assert "Traceback" not in err and err.startswith("error: ") and "NVRTC" in err, err


def test_no_gpu_is_explained_in_our_words():
    from llmcupy.runtime.backend import explain_cuda_error

    class CUDARuntimeError(RuntimeError):
        pass

    text = explain_cuda_error(CUDARuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient "
                                               "for CUDA runtime version"))
    assert text.startswith("no usable NVIDIA GPU") and "without a GPU this is expected" in text


# (CLI, argv): every CLI that runs kernels, asked for the cuda backend on a machine where it is unusable
CUDA_ASKED = [
    ("kernel", ["softmax_forward", 1]),
    ("kernel", ["--all"]),
    ("bench", ["--ops", "softmax_forward"]),
    ("train", SMALL + ["--steps", 1, "-v", 0, "-s", 0, "-i", "{tokens}"]),
    ("sample", ["-e", "{model}", "-n", 1, "-t", 8, "--bpe", "{bpe}"]),
    ("profile", ["--init", "d1", "-b", 1, "-t", 8, "--random-data"]),
    ("startup", ["--init", "d1", "-i", "{tokens}"]),
    ("launchbench", ["--repeats", 1]),
]


@pytest.mark.parametrize("cli,argv", CUDA_ASKED, ids=[f"{c}-{i}" for i, (c, _) in enumerate(CUDA_ASKED)])
def test_cuda_asked_for_without_a_usable_gpu_is_one_line_exit_2(cli, argv, good_files, tmp_path, monkeypatch):
    """LLMCUPY_BACKEND=cuda (as bench/gpu_session.sh sets) where CuPy cannot reach a GPU: the reason in
    one line and exit 2, never a traceback, whether or not this machine has a GPU (the probe is faked)."""
    from llmcupy.runtime import backend

    monkeypatch.setenv("LLMCUPY_BACKEND", "cuda")
    monkeypatch.setattr(backend, "_backend", None)
    monkeypatch.setattr(backend, "cuda_unavailable_reason", lambda: "no usable NVIDIA GPU (faked by the test)")
    subst = {f"{{{k}}}": str(v) for k, v in good_files.items()}
    rc, out, err = _call(_cli(cli), [subst.get(str(a), a) for a in argv])
    assert rc == 2, f"rc {rc}\n{out[-1500:]}\n{err}"
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "backend 'cuda' was requested but no usable NVIDIA GPU (faked" in errors[0], err
    assert "Traceback" not in err


@pytest.mark.gpu
def test_gpu_two_runs_of_the_default_configuration_print_identical_losses(inputs):
    """On a GPU the atomics of a nondeterministic version really race (the emulator's two cores
    rarely show it): the default step must still give bit-identical losses run after run."""
    argv = ["--backend", "cuda", "--init", "d2", "-b", 4, "-t", 64, "--steps", 8, "-v", 0, "-s", 0] + inputs["data"]
    rc, out1, err = _train(argv)
    assert rc == 0, err
    rc, out2, err = _train(argv)
    assert rc == 0, err
    assert len(_losses(out1)) == 8 and _losses(out1) == _losses(out2)


def test_ctrl_c_during_a_save_in_a_real_process_exits_130_after_the_save(inputs, tmp_path):
    """A real SIGINT from outside, delivered while the save is under way (the save is slowed down
    by a wrapper that announces it), to ``python -m llmcupy.train``'s own main."""
    import textwrap
    import time

    state = tmp_path / "state.npz"
    script = textwrap.dedent("""
        import sys, time
        from llmcupy import checkpoint, train
        real = checkpoint.save_training_state
        def slow(path, st):
            print("SAVING", st.step, flush=True)
            time.sleep(3)            # the test's SIGINT lands here, in the middle of the save
            real(path, st)
        checkpoint.save_training_state = slow
        sys.exit(train.main(sys.argv[1:]))
    """)
    argv = SMALL + ["--steps", 4, "-v", 0, "-s", 0, "--save-every", 2, "--save-path", state, "-i", inputs["train"]]
    env = dict(os.environ, PYTHONPATH=str(REPO), LLMCUPY_BACKEND="sim")
    proc = subprocess.Popen([sys.executable, "-c", script, *map(str, argv)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("SAVING"):
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=300)
    out = "".join(lines) + out
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert "saved the training state at step 2" in out and "step    3/4" not in out, out
    assert "interrupted while saving step 2" in err and "Traceback" not in err, err
    assert ckpt.load_training_state(state).step == 2
