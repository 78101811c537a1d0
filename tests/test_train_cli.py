"""The trainer and its correctness gate end to end (the issue's acceptance), in the emulator.

* ``python -m llmcupy.data tinyshakespeare --input <shared>/tinyshakespeare.txt --bpe <shared>/gpt2.tiktoken``
  writes llm.c's token files;
* ``python -m llmcupy.train --init d2 -b 4 -t 64 --steps 20 -i ... -j ...`` trains (a real
  subprocess): the loss falls, a sample is printed, llm.c's log lines go to ``-o``;
* ``--matmul-kernel 4`` trains too (and gives the default kernels' losses); a shape it cannot run,
  an unknown or unavailable version, -t beyond the model's context and a missing model file are
  clear errors with exit code 2; ``--benchmark`` prints mean/min ms per step;
* ``python -m llmcupy.torch_gpt2`` writes the gate's inputs and ``python -m llmcupy.test_gpt2``
  prints ``overall okay: 1``; corrupted or truncated model / debug-state files fail with exit 2.

Everything but the 20-step run calls the CLIs' ``main(argv)`` in-process (same code path, no
interpreter start-up). The inputs are made here (``gen_inputs``: generated Shakespeare-like text and
a GPT-2-shaped BPE rank file), so a fresh clone runs all of it offline. The real Tiny Shakespeare
split sizes are checked too when its text and GPT-2's BPE ranks are available (``$LLMCUPY_TEST_DATA``,
default ``<repo>/../shared/data``, holding ``tinyshakespeare.txt`` and ``gpt2.tiktoken``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llmcupy import checkpoint as ckpt
from llmcupy.config import GPT2Config, init_params

import gen_inputs
from _helpers import run_cli

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("LLMCUPY_TEST_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
TEXT, BPE = SHARED / "tinyshakespeare.txt", SHARED / "gpt2.tiktoken"
STEP_LINE = re.compile(r"^step +(\d+)/(\d+): train loss ([0-9.]+) \(([0-9.]+) ms, (\d+) tok/s\)$", re.M)


_call = run_cli   # (exit code, stdout, stderr) of an in-process CLI call


def _train(argv):
    from llmcupy import train

    return _call(train.main, argv)


def _losses(stdout: str) -> list[float]:
    return [float(m.group(3)) for m in STEP_LINE.finditer(stdout)]


@pytest.fixture(scope="module")
def tiny_bpe(tmp_path_factory):
    """A GPT-2-shaped BPE rank file made here (see gen_inputs)."""
    return gen_inputs.write_tiny_bpe(tmp_path_factory.mktemp("bpe") / "tiny.tiktoken")


@pytest.fixture(scope="module")
def ts_data(tmp_path_factory, tiny_bpe):
    """Generated Shakespeare-like text as llm.c's token files, made by ``python -m llmcupy.data
    tinyshakespeare --input`` (in-process): the val split takes its 32,768 tokens, train the rest."""
    from llmcupy import data

    d = tmp_path_factory.mktemp("tinyshakespeare")
    text = d / "generated.txt"
    text.write_text(gen_inputs.make_text(n_sections=1700, seed=7))
    rc, stdout, stderr = _call(data.main, ["tinyshakespeare", "--input", text, "--bpe", tiny_bpe, "--out", d])
    assert rc == 0, stderr
    return d


@pytest.fixture(scope="module")
def small_train_args(ts_data):
    """The -i / -j flags for the prepared Tiny Shakespeare files."""
    return ["-i", ts_data / "tiny_shakespeare_train.bin", "-j", ts_data / "tiny_shakespeare_val.bin"]


def test_prepare_generated_text(ts_data):
    from llmcupy.data import read_tokens, token_count

    # llm.c's split: the first 32,768 tokens are val, the rest train
    assert token_count(ts_data / "tiny_shakespeare_val.bin") == 32768
    assert token_count(ts_data / "tiny_shakespeare_train.bin") > 4 * 64 * 20
    val = read_tokens(ts_data / "tiny_shakespeare_val.bin")
    assert val[0] == 50256                      # an EOT before the first section


def test_prepare_real_tinyshakespeare(tmp_path):
    if not (TEXT.is_file() and BPE.is_file()):
        pytest.skip(f"optional real-data check: set LLMCUPY_TEST_DATA to a folder holding tinyshakespeare.txt "
                    f"and gpt2.tiktoken (looked in {SHARED})")
    from llmcupy import data
    from llmcupy.data import token_count

    rc, _, stderr = _call(data.main, ["tinyshakespeare", "--input", TEXT, "--bpe", BPE, "--out", tmp_path])
    assert rc == 0, stderr
    # llm.c's split: the first 32,768 tokens are val, the other 305,260 train
    assert token_count(tmp_path / "tiny_shakespeare_val.bin") == 32768
    assert token_count(tmp_path / "tiny_shakespeare_train.bin") == 305260


def test_train_d2_twenty_steps(ts_data, tiny_bpe, tmp_path):
    """The acceptance run, as a real ``python -m llmcupy.train`` process (offline: --bpe)."""
    log = tmp_path / "log.txt"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("LLMCUPY_GPT2_BPE", None)
    env.setdefault("LLMCUPY_BACKEND", "sim")
    cmd = [sys.executable, "-m", "llmcupy.train", "--init", "d2", "-b", "4", "-t", "64", "--steps", "20",
           "--bpe", str(tiny_bpe),
           "-i", str(ts_data / "tiny_shakespeare_train.bin"), "-j", str(ts_data / "tiny_shakespeare_val.bin"),
           "-o", str(log), "-v", "10", "-m", "2", "-s", "20", "-g", "8"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, timeout=600)
    stdout, stderr = proc.stdout.decode("utf-8", errors="replace"), proc.stderr.decode("utf-8", errors="replace")
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    # the configuration table and the kernel versions
    assert re.search(r"\| batch size B +\| 4 ", stdout) and re.search(r"\| sequence length T +\| 64 ", stdout)
    assert re.search(r"\| num_layers L +\| 2 ", stdout) and re.search(r"\| train_num_batches +\| 20 ", stdout)
    assert "kernel versions:" in stdout and "matmul_forward" in stdout
    # compiles are announced and happen before step 1 (not inside its time)
    assert stdout.index("compiling kernels (first run, cached afterwards)") < stdout.index("step    1/20")
    assert "\r" not in stderr            # not a terminal: no progress-bar clutter
    # 20 step lines, the loss falls
    steps = [(int(m.group(1)), int(m.group(2))) for m in STEP_LINE.finditer(stdout)]
    assert steps == [(i, 20) for i in range(1, 21)], stdout[-3000:]
    losses = _losses(stdout)
    assert all(np.isfinite(losses))
    assert abs(losses[0] - np.log(50257)) < 0.5                  # random init: near uniform
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.1, losses
    val = [float(v) for v in re.findall(r"^val loss ([0-9.]+)$", stdout, re.M)]
    assert len(val) == 3 and val[-1] < val[0], val               # steps 0, 10, 20
    # one sample, at the end (sample_every 20), framed as llm.c frames it
    assert stdout.count("generating:\n---\n") == 1
    sample = stdout.split("generating:\n---\n")[1].split("\n---\n")[0]
    assert sample.strip(), "empty sample"
    assert "total average iteration time:" in stdout
    # llm.c's log lines
    lines = log.read_text().splitlines()
    assert all(re.fullmatch(r"s:\d+ (trl|tel):\d+\.\d{4}", line) for line in lines), lines
    assert [line for line in lines if "trl" in line] == [f"s:{i} trl:{l:.4f}" for i, l in enumerate(losses)]
    assert [line.split()[0] for line in lines if "tel" in line] == ["s:0", "s:10", "s:20"]


def _c128_model(tmp_path) -> Path:
    """A one-layer model with C = 128: every matmul (OC = 3C, C, 4C, Vp) suits version 4's tiles."""
    cfg = GPT2Config(max_seq_len=64, num_layers=1, num_heads=4, channels=128)
    path = tmp_path / "c128.bin"
    ckpt.write_model(path, cfg, init_params(cfg, seed=3))
    return path


def test_matmul_kernel_4(small_train_args, tmp_path):
    model = _c128_model(tmp_path)
    common = ["-e", model, "-b", 4, "-t", 32, "--steps", 2, "-v", 0, "-s", 0] + small_train_args
    rc, out4, err = _train(common + ["--matmul-kernel", 4])
    assert rc == 0, err
    assert re.search(r"^  matmul_forward +4 ", out4, re.M), out4
    rc, out2, err = _train(common + ["--matmul-kernel", 2])
    assert rc == 0, err
    # the hand-written kernel and cuBLAS compute the same FP32 products (in other orders)
    assert len(_losses(out4)) == 2
    np.testing.assert_allclose(_losses(out4), _losses(out2), atol=1e-5)


def test_matmul_kernel_4_refuses_shapes_it_cannot_run(small_train_args):
    # d1 has C = 64: the QKV matmul's OC = 192 is not a multiple of version 4's 128-wide tiles
    rc, _, err = _train(["--init", "d1", "-b", 4, "-t", 32, "--steps", 1, "-v", 0, "-s", 0,
                         "--matmul-kernel", 4] + small_train_args)
    assert rc == 2
    assert "matmul_forward version 4" in err and "OC = 192 must be a multiple of 128" in err, err


def test_unknown_or_unavailable_kernel_versions_exit_2():
    rc, _, err = _train(["--matmul-kernel", 99])
    assert rc == 2 and "matmul_forward has no version 99; versions: 1, 2, 3, 4" in err, err
    rc, _, err = _train(["--kernel", "attention_backward=42"])
    assert rc == 2 and re.search(r"attention_backward has no version 42; versions: 1, 2, 3", err), err
    rc, _, err = _train(["--attention-forward-kernel", 5])  # BF16 in llm.c: listed, not run in FP32
    assert rc == 2 and "attention_forward version 5 is unavailable" in err, err
    rc, _, err = _train(["--kernel", "softmax_forward=1"])
    assert rc == 2 and "not an op of the training step" in err, err
    rc, _, err = _train(["--kernel", "adamw"])
    assert rc == 2 and "expected OP=N" in err, err
    rc, _, err = _train(["--kernel", "adamw=x"])
    assert rc == 2 and "must be integers" in err, err


def test_a_block_size_the_gpu_cannot_hold_exits_2_naming_op_version_and_flag(small_train_args, monkeypatch):
    """As on a GPU whose registers per block do not fit GELU's kernel at the step's 512 threads:
    the error names the op, version and block size to change, and the flag that changes them."""
    from llmcupy.ops._op import clear_plans
    from llmcupy.runtime import DeviceLimitError
    from llmcupy.runtime.module import RawKernel

    real = RawKernel.max_threads_per_block
    monkeypatch.setattr(RawKernel, "max_threads_per_block",
                        property(lambda k: 256 if k.name == "gelu_forward_kernel2" else real.fget(k)))
    monkeypatch.setattr(RawKernel, "_too_many_threads", lambda k, threads: DeviceLimitError(
        f"{k.name}: a block of {threads} threads needs 80 registers per thread"))
    clear_plans()   # a replayed launch plan skips the checks (the limit cannot change on a real device)
    rc, _, err = _train(["--init", "d1", "-b", 2, "-t", 32, "--steps", 1, "-v", 0, "-s", 0] + small_train_args)
    clear_plans()
    assert rc == 2, err
    assert ("error: gelu_forward version 2 at block size 512: gelu_forward_kernel2: a block of 512 threads needs "
            "80 registers per thread (with --kernel OP=VERSION:BLOCK_SIZE)") in err, err


def test_seq_len_beyond_the_model_context(small_train_args):
    rc, _, err = _train(["--init", "d2", "-t", 512] + small_train_args)
    assert rc == 2
    assert "-t 512 is larger than the model's context (max_seq_len = 256)" in err, err


def test_missing_model_file_hint(small_train_args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                  # no gpt2_124M.bin here
    rc, _, err = _train(small_train_args)
    assert rc == 2
    assert "no model file 'gpt2_124M.bin'" in err and "--init" in err and "llmcupy.download" in err, err
    rc, _, err = _train(["-e", tmp_path / "nope.bin"] + small_train_args)
    assert rc == 2 and "nope.bin" in err, err
    # a model file that is not one
    (tmp_path / "junk.bin").write_bytes(b"\0" * 2048)
    rc, _, err = _train(["-e", tmp_path / "junk.bin"] + small_train_args)
    assert rc == 2 and "junk.bin" in err and "magic" in err, err


def test_missing_or_bad_data_files(tmp_path):
    rc, _, err = _train(["--init", "d1", "-b", 1, "-t", 16, "-i", tmp_path / "none_*.bin"])
    assert rc == 2 and "no token files match" in err, err
    (tmp_path / "bad.bin").write_bytes(b"\1" * 3000)
    rc, _, err = _train(["--init", "d1", "-b", 1, "-t", 16, "-i", tmp_path / "bad.bin"])
    assert rc == 2 and "bad.bin" in err, err


def test_benchmark(small_train_args):
    rc, out, err = _train(["--init", "d1", "-b", 1, "-t", 16, "--benchmark", "--steps", 2, "--warmup", 1]
                          + small_train_args)
    assert rc == 0, err
    assert len(_losses(out)) == 2
    m = re.search(r"benchmark: B=1 T=16, 2 steps after 1 warm-up: mean ([0-9.]+) ms/step, min ([0-9.]+) ms/step, "
                  r"(\d+) tok/s", out)
    assert m, out
    assert 0 < float(m.group(2)) <= float(m.group(1))
    assert "val loss" not in out and "generating" not in out
    assert re.search(r"^launches per step: \d+ kernel launches", out, re.M), out


def test_fused_benchmark_launches_fewer_kernels_with_the_same_loss(small_train_args):
    runs = {}
    for flags in ([], ["--fused"]):
        rc, out, err = _train(["--init", "d1", "-b", 1, "-t", 16, "--benchmark", "--steps", 1, "--warmup", 1]
                              + flags + small_train_args)
        assert rc == 0, err
        launches = int(re.search(r"^launches per step: (\d+) kernel launches", out, re.M).group(1))
        runs[bool(flags)] = (_losses(out), launches, out)
    (plain_losses, plain_launches, _), (fused_losses, fused_launches, fused_out) = runs[False], runs[True]
    # d1: one layer; the fusions replace residual + layernorm twice, matmul + GELU and the attention ladder
    assert fused_launches < plain_launches
    assert len(plain_losses) == 1    # the timed step (no step line matched: [] == approx([]) passed)
    assert fused_losses == pytest.approx(plain_losses, rel=1e-5)
    for op in ("fused_residual_forward", "matmul_gelu_forward", "flash_attention_forward", "flash_attention_backward"):
        assert op in fused_out


# ---------------------------------------------------------------------------------------------
# the correctness gate


@pytest.fixture(scope="module")
def gate_files(ts_data, tmp_path_factory):
    """torch_gpt2's gate inputs for d1 at B=4, T=16 on the first tokens of the val split (as llm.c's
    debug state is made), with the losses of ten torch.optim.AdamW steps."""
    pytest.importorskip("torch")
    from llmcupy import torch_gpt2

    d = tmp_path_factory.mktemp("gate")
    files = {"model": d / "model.bin", "state": d / "state.bin", "losses": d / "losses.json"}
    rc, out, err = _call(torch_gpt2.main, ["--init", "d1", "--B", 4, "--T", 16,
                                           "--data", ts_data / "tiny_shakespeare_val.bin",
                                           "--out-model", files["model"], "--out-state", files["state"],
                                           "--out-losses", files["losses"]])
    assert rc == 0, err
    assert len(json.loads(files["losses"].read_text())) == 10
    return files


def _gate(argv):
    from llmcupy import test_gpt2

    return _call(test_gpt2.main, argv)


def test_gate_passes(gate_files):
    rc, out, err = _gate(["--checkpoint", gate_files["model"], "--debug-state", gate_files["state"],
                          "--expected-losses", gate_files["losses"]])
    assert rc == 0, out + err
    for verdict in ("OK (LOGITS)", "LOSS OK", "OK (GRADS)", "step losses decrease: OK", "overall okay: 1"):
        assert verdict in out, out
    assert out.count("TENSOR OK") == 16
    assert len(re.findall(r"^  step \d: loss [0-9.]+ expected [0-9.]+ OK$", out, re.M)) == 10


def test_gate_fails_for_another_model(gate_files, tmp_path):
    # the state's batch and references, with other weights: logits, loss and gradients all differ
    other = tmp_path / "other.bin"
    cfg, _ = ckpt.read_model(gate_files["model"])
    ckpt.write_model(other, cfg, init_params(cfg, seed=99))
    rc, out, err = _gate(["--checkpoint", other, "--debug-state", gate_files["state"], "--steps", 2])
    assert rc == 1, out + err
    assert "NOT OK (LOGITS)" in out and "NOT OK (GRADS)" in out and "overall okay: 0" in out


def _corrupt(src: Path, dst: Path, *, truncate: int | None = None, offset: int | None = None) -> Path:
    data = bytearray(src.read_bytes())
    if truncate is not None:
        data = data[:truncate]
    if offset is not None:
        data[offset:offset + 4] = b"\xff\xff\xff\x7f"
    dst.write_bytes(bytes(data))
    return dst


@pytest.mark.parametrize("which,how", [
    ("state", "truncated"), ("state", "magic"), ("state", "header T"), ("model", "truncated"), ("model", "magic"),
    ("state", "missing"), ("losses", "not json")])
def test_gate_refuses_bad_files(gate_files, tmp_path, which, how):
    files = dict(gate_files)
    src = files[which]
    if how == "truncated":
        files[which] = _corrupt(src, tmp_path / src.name, truncate=src.stat().st_size - 100)
        expect = "100 missing"
    elif how == "magic":
        files[which] = _corrupt(src, tmp_path / src.name, offset=0)
        expect = "magic"
    elif how == "header T":
        files[which] = _corrupt(src, tmp_path / src.name, offset=12)      # header[3]: T
        expect = "max_seq_len"
    elif how == "missing":
        files[which] = tmp_path / "missing.bin"
        expect = "missing.bin"
    else:
        files[which] = tmp_path / "losses.json"
        files[which].write_text("[5.2, 4.0,")
        expect = "losses.json"
    rc, out, err = _gate(["--checkpoint", files["model"], "--debug-state", files["state"],
                          "--expected-losses", files["losses"]])
    assert rc == 2, out + err
    assert err.startswith("error: ") and str(files[which]) in err and expect in err, err
    assert "overall okay" not in out          # refused before running anything


def test_gate_tools_refuse_bad_arguments(tmp_path, small_train_args):
    from llmcupy import test_gpt2, torch_gpt2

    out = ["--out-model", tmp_path / "m.bin", "--out-state", tmp_path / "s.bin"]
    rc, _, err = _call(torch_gpt2.main, ["--model", tmp_path / "nope.bin"] + out)
    assert rc == 2 and "nope.bin" in err, err
    rc, _, err = _call(torch_gpt2.main, ["--init", "d1", "--B", 0] + out)
    assert rc == 2 and "--B and --T must be positive" in err, err
    rc, _, err = _call(torch_gpt2.main, ["--init", "d3"] + out)
    assert rc == 2 and "invalid choice" in err, err
    rc, _, err = _call(torch_gpt2.main, ["--init", "d1", "--T", 512] + out)
    assert rc == 2 and "larger than the model's context" in err, err
    assert not (tmp_path / "m.bin").exists()
    # outputs are checked before PyTorch runs: --out-model on the --data file replaced the token file,
    # a folder was named as a hidden temporary file, --seed -1 was NumPy's traceback
    data = Path(small_train_args[3])          # the val token file
    before = data.read_bytes()
    for argv, needle in (
            (["--data", data, "--out-model", data, "--out-state", tmp_path / "s.bin"],
             f"--out-model {data} is the file --data reads"),
            (["--out-model", tmp_path, "--out-state", tmp_path / "s.bin"], f"--out-model {tmp_path}: it is a folder"),
            (["--out-model", tmp_path / "x", "--out-state", tmp_path / "x"], "--out-model and --out-state both name"),
            (["--seed", -1] + out, "--seed must be >= 0")):
        rc, _, err = _call(torch_gpt2.main, ["--init", "d1", "--B", 1, "--T", 8] + argv)
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert data.read_bytes() == before and not (tmp_path / "m.bin").exists()
    rc, _, err = _call(test_gpt2.main, ["--steps", 0])
    assert rc == 2 and "--steps must be at least 1" in err, err
    rc, _, err = _call(test_gpt2.main, ["--checkpoint", tmp_path / "nope.bin"])
    assert rc == 2 and "nope.bin" in err, err


def test_gate_loss_rule_allows_an_overshoot_but_not_divergence():
    from llmcupy.test_gpt2 import losses_fall

    # PyTorch's own losses for a random-init GPT-2 124M at B=4, T=64 (torch_gpt2, seed 0): step 3 overshoots
    assert losses_fall([10.99, 9.09, 8.04, 9.67, 7.47, 6.75, 6.11, 5.06, 4.57, 4.47])
    assert not losses_fall([10.9, 10.5, 11.2])
    assert not losses_fall([10.9, float("nan"), 9.0])


def test_measured_defaults_are_used_and_named_and_flags_override_them(small_train_args, tmp_path, monkeypatch):
    # bench/defaults.json names the GPU its versions were measured on; here a synthetic file names
    # the emulator's "device", so the trainer's side of the mechanism runs without a GPU
    from llmcupy import defaults
    from llmcupy.runtime import backend

    path = defaults.write({"schema": defaults.SCHEMA, "devices": {backend.device_name(): {
        "source": "bench/results/synthetic.json", "date": "2026-11-01T00:00:00Z", "commit": "c" * 40,
        "ops": {"layernorm_forward": {"version": 3, "block_size": 512, "ms": 0.04}}}}}, tmp_path / "defaults.json")
    monkeypatch.setenv("LLMCUPY_DEFAULTS", str(path))
    base = ["--init", "d1", "-b", 1, "-t", 16, "--benchmark", "--steps", 1, "--warmup", 0] + small_train_args
    rc, out, err = _train(base)
    assert rc == 0, err
    assert re.search(r"^  layernorm_forward +3  .*\[measured\]$", out, re.M), out
    assert f"the fastest version measured on {backend.device_name()}" in out
    rc, out, err = _train(base + ["--kernel", "layernorm_forward=5"])
    assert rc == 0, err
    assert re.search(r"^  layernorm_forward +5  .*[^]]$", out, re.M), out
    rc, out, err = _train(base + ["--kernel-defaults", "catalogue"])
    assert rc == 0, err
    assert re.search(r"^  layernorm_forward +6  ", out, re.M) and "as --kernel-defaults catalogue asks" in out, out
    path.write_text("{")
    rc, out, err = _train(base)
    assert rc == 2 and str(path) in err and len(err.strip().splitlines()) == 1, err


def test_without_measurements_the_trainer_says_its_defaults_are_llmcs(small_train_args, tmp_path, monkeypatch):
    monkeypatch.setenv("LLMCUPY_DEFAULTS", str(tmp_path / "none.json"))
    rc, out, err = _train(["--init", "d1", "-b", 1, "-t", 16, "--benchmark", "--steps", 1, "--warmup", 0]
                          + small_train_args)
    assert rc == 0, err
    assert "kernel defaults: the catalogue's (llm.c's choices but where --list says why not; not measured)" in out and "[measured]" not in out
