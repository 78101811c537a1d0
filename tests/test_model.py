"""The GPT-2 model (llmcupy.model) against PyTorch on the CPU, and the trainer's resume / NaN handling.

* A tiny GPT-2 (L=2, C=64, NH=4, T=32, the real vocabulary V=50257 / Vp=50304, B=4 so that
  B*T = 128 suits matmul_forward version 4): our logits, loss and every parameter gradient match
  ``llmcupy.torch_gpt2`` (PyTorch, FP32, CPU); ten AdamW steps match ``torch.optim.AdamW``.
* Every version of every op of the training step (``model.STEP_OPS``) swapped into the model at
  least once: the logits, loss and gradients still match (AdamW versions: the update too). A
  one-layer model at B=1, T=16 unless the version's ``requires()`` refuses that shape, then B=4,
  T=32; versions that refuse both, or are unavailable, are skipped with the reason.
* One training step, plain and fused, runs clean under the emulator's sanitizers (racecheck within
  and between blocks, memcheck, initcheck).
* The model refuses T > max_seq_len and token ids outside [0, V) with a ModelError.
* Resuming a run from ``--save-every``'s state gives the uninterrupted run's losses, samples and
  final state bit for bit; a NaN loss stops the CLI with the step, a non-zero exit and the last
  saved state untouched.

Tolerances (FP32 on both sides; they differ only in summation order, e.g. cuBLAS or a warp tree
against PyTorch's blocked reductions). Rounding grows like sqrt(n)*eps for sums of n terms: the
longest sums here are over Vp (the LM head's dlnf), 4C (fcproj) and B*T (weight gradients), i.e.
relative errors of about 1e-6 (measured: logits 4e-7 absolute at |logits| ~ 1, every gradient
tensor within 9e-7 of its max |ref|, the loss bit-equal). The bounds below leave about 100x headroom
for the kernels' other orders (atomics, single-pass variance) while a missing or doubled term
would still be off by >= 1e-2 relative.
"""

from __future__ import annotations

import contextlib
import functools
import io
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest

import llmcupy
from llmcupy import checkpoint as ckpt
from llmcupy.config import PARAM_NAMES, GPT2Config, init_params, split_params
from llmcupy.data import write_tokens
from llmcupy.model import GPT2, STEP_OPS, KernelChoice, ModelError
from llmcupy.runtime import backend as _backend

LOGITS_ATOL, LOGITS_RTOL = 1e-5, 1e-5       # |logits| ~ 1: 100x the measured 4e-7
LOSS_RTOL = 1e-5                            # a mean of B*T log-softmaxes; measured bit-equal
GRAD_REL = 1e-4                             # per tensor: max |ours - ref| <= 1e-4 * max |ref|; measured 9e-7
# AdamW moves every parameter by about lr per step (m_hat / sqrt(v_hat) ~ +-1), so ten steps at
# lr 1e-4 move it by up to 1e-3; rounding differences in the gradients shift the update only where
# |g| is well above eps = 1e-8. 1e-5 = 1% of the total movement (measured 1.1e-6).
PARAM_ATOL_10_STEPS = 1e-5
LOSS_ATOL_10_STEPS = 1e-5                   # measured 2e-6 (a couple of ulps at 10.6)

TINY = GPT2Config(max_seq_len=32, num_layers=2, num_heads=4, channels=64)     # V 50257, Vp 50304
TINY_B, TINY_T = 4, 32                                                        # B*T = 128
# The version sweep: one layer, smallest shape first. matmul_forward version 4 (128 x 128 tiles, no
# bounds checks) also needs B*T % 128 == 0 and every OC (3C, C, 4C, Vp) % 128 == 0, i.e. C = 128.
SWEEP = GPT2Config(max_seq_len=32, num_layers=1, num_heads=4, channels=64)
SWEEP_C128 = GPT2Config(max_seq_len=32, num_layers=1, num_heads=4, channels=128)
SWEEP_SHAPES = ((SWEEP, 1, 16), (SWEEP, 4, 32), (SWEEP_C128, 4, 32))

# the gate's optimizer settings (llm.c's test_gpt2): weight decay on, so it is exercised
ADAMW = dict(lr=1e-4, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)


def _batch(cfg: GPT2Config, B: int, T: int, seed: int):
    tokens = np.random.default_rng(seed).integers(0, cfg.vocab_size, (B, T + 1)).astype(np.int32)
    return tokens[:, :-1].copy(), tokens[:, 1:].copy()


@functools.lru_cache(maxsize=None)
def _torch_reference(cfg: GPT2Config, B: int, T: int, seed: int = 1):
    """params, x, y and PyTorch's (logits (B,T,Vp), loss, grads) for a config and batch shape.
    Shared between tests: give the model a copy of ``params``."""
    pytest.importorskip("torch")
    from llmcupy import torch_gpt2

    params = init_params(cfg, seed=seed)
    x, y = _batch(cfg, B, T, seed)
    logits, loss, grads = torch_gpt2.forward_backward(params, cfg, x, y)
    return params, x, y, logits, loss, grads


def _assert_logits(cfg, ours, ref):
    V = cfg.vocab_size
    np.testing.assert_allclose(ours, ref[..., :V], rtol=LOGITS_RTOL, atol=LOGITS_ATOL,
                               err_msg="logits differ from PyTorch's")


def _assert_grads(cfg, ours: np.ndarray, ref: np.ndarray) -> None:
    assert np.isfinite(ours).all(), "non-finite gradients"
    bad = []
    mine, theirs = split_params(ours, cfg), split_params(ref, cfg)
    for name in PARAM_NAMES:
        scale = float(np.abs(theirs[name]).max())
        diff = float(np.abs(mine[name].astype(np.float64) - theirs[name]).max())
        assert scale > 0, f"PyTorch's gradient of {name} is all zero: the test would prove nothing"
        if diff > GRAD_REL * scale:
            bad.append(f"{name}: max |diff| {diff:.3e} > {GRAD_REL} * max |ref| {scale:.3e}")
    assert not bad, "gradients differ from PyTorch's:\n  " + "\n  ".join(bad)


def _adamw_reference(params, grads, m, v, t, lr, beta1, beta2, eps, weight_decay):
    """llm.c's AdamW step in float64 (weight decay on every parameter). The hyperparameters are
    FP32 values on the device: 1 - float32(0.999) is 1.3e-5 away from 0.001, so use those."""
    lr, beta1, beta2, eps, weight_decay = (float(np.float32(h)) for h in (lr, beta1, beta2, eps, weight_decay))
    g = grads.astype(np.float64)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
    params = params - lr * (m_hat / (np.sqrt(v_hat) + eps) + weight_decay * params)
    return params, m, v


# ---------------------------------------------------------------------------------------------
# the default kernels against PyTorch


@pytest.fixture(scope="module")
def tiny_run():
    """Our model on TINY with the default kernels: logits, then ten AdamW steps on one batch
    (step-0 loss and gradients kept), next to PyTorch's values for the same."""
    pytest.importorskip("torch")
    from llmcupy import torch_gpt2

    params, x, y, ref_logits, ref_loss, ref_grads = _torch_reference(TINY, TINY_B, TINY_T)
    ref_losses, ref_params = torch_gpt2.adamw_losses(params, TINY, x, y, steps=10, **ADAMW)
    model = GPT2(TINY, params.copy())
    model.forward(x)
    out = {"logits": _backend.to_numpy(model.logits()).copy(),
           "padded_logits": _backend.to_numpy(model.acts["logits"][..., TINY.vocab_size:]).copy()}
    losses = []
    for step in range(10):
        losses.append(model.forward(x, y))
        model.zero_grad()
        model.backward()
        if step == 0:
            out["grads"] = model.grads_numpy()
        model.update(t=step + 1, **ADAMW)
    out.update(losses=losses, params=model.params_numpy())
    ref = {"logits": ref_logits, "loss": ref_loss, "grads": ref_grads, "losses": ref_losses, "params": ref_params}
    return out, ref


def test_logits_match_pytorch(tiny_run):
    ours, ref = tiny_run
    _assert_logits(TINY, ours["logits"], ref["logits"])
    # the padded vocabulary columns: wte's zero rows give zero logits
    assert not ours["padded_logits"].any()


def test_loss_matches_pytorch(tiny_run):
    ours, ref = tiny_run
    assert ours["losses"][0] == pytest.approx(ref["loss"], rel=LOSS_RTOL)
    # a random-init model predicts roughly uniformly: the loss is near ln(V)
    assert abs(ours["losses"][0] - np.log(TINY.vocab_size)) < 0.5


def test_all_gradients_match_pytorch(tiny_run):
    ours, ref = tiny_run
    _assert_grads(TINY, ours["grads"], ref["grads"])
    # the padded rows of wte get no gradient
    assert not split_params(ours["grads"], TINY)["wte"][TINY.vocab_size:].any()


def test_ten_adamw_steps_match_torch_optim(tiny_run):
    ours, ref = tiny_run
    np.testing.assert_allclose(ours["losses"], ref["losses"], rtol=0, atol=LOSS_ATOL_10_STEPS,
                               err_msg="step losses differ from torch.optim.AdamW's")
    assert all(b < a for a, b in zip(ours["losses"], ours["losses"][1:])), ours["losses"]
    diff = np.abs(ours["params"] - ref["params"])
    assert float(diff.max()) <= PARAM_ATOL_10_STEPS, (
        f"parameters after 10 steps differ by {diff.max():.3e} at index {int(diff.argmax())}")
    # the padded rows of wte stay zero
    assert not split_params(ours["params"], TINY)["wte"][TINY.vocab_size:].any()


# ---------------------------------------------------------------------------------------------
# every version of every op of the step, swapped in


def _all_versions():
    cases = []
    for op in STEP_OPS:
        for n in sorted(llmcupy.ops[op].versions):
            cases.append(pytest.param(op, n, id=f"{op}-v{n}"))
    return cases


def _run_with_version(op: str, n: int, cfg: GPT2Config, B: int, T: int, refusals: list):
    params, x, y, ref_logits, ref_loss, ref_grads = _torch_reference(cfg, B, T)
    choice = KernelChoice()
    choice.set(op, n)
    model = GPT2(cfg, params.copy(), choice)
    try:
        model.forward(x)
        logits = _backend.to_numpy(model.logits()).copy()
        loss = model.forward(x, y)
        model.zero_grad()
        model.backward()
        grads = model.grads_numpy()
        after = []
        if op == "adamw":
            for t in (1, 2):   # t = 2: non-zero moments and a second bias correction
                model.update(t=t, **ADAMW)
                after.append((model.params_numpy(), _backend.to_numpy(model.m).copy(),
                              _backend.to_numpy(model.v).copy()))
    except llmcupy.ops.OpError:
        if refusals:       # the version's requires() refused this shape: not a failure
            return None
        raise
    return params, (ref_logits, ref_loss, ref_grads), (logits, loss, grads, after)


@pytest.mark.parametrize("op,n", _all_versions())
def test_every_op_version_in_the_model(op, n, monkeypatch, no_hazards):
    version = llmcupy.ops[op].versions[n]
    if not version.available:
        pytest.skip(f"{op} version {n} is unavailable: {version.unavailable}")
    # Record what this version's requires() refuses, so a refusal (try a larger shape, or skip)
    # is told apart from a genuine error of the op.
    refusals: list[str] = []
    if version.requires is not None:
        original = version.requires

        def recording(arrays, block_size):
            problem = original(arrays, block_size)
            if problem:
                refusals.append(problem)
            return problem

        monkeypatch.setattr(version, "requires", recording)
    result = None
    for cfg, B, T in SWEEP_SHAPES:
        refusals.clear()
        result = _run_with_version(op, n, cfg, B, T, refusals)
        if result is not None:
            break
    if result is None:
        shapes = ", ".join(f"C={c.channels} B={B} T={T}" for c, B, T in SWEEP_SHAPES)
        pytest.skip(f"{op} version {n} refuses every test shape ({shapes}): {refusals[0]}")
    params, (ref_logits, ref_loss, ref_grads), (logits, loss, grads, after) = result
    _assert_logits(cfg, logits, ref_logits)
    assert loss == pytest.approx(ref_loss, rel=LOSS_RTOL)
    _assert_grads(cfg, grads, ref_grads)
    if op == "adamw":
        p, m, v = params.astype(np.float64), np.zeros(params.size), np.zeros(params.size)
        for t, (p_got, m_got, v_got) in zip((1, 2), after):
            p, m, v = _adamw_reference(p, grads, m, v, t, **ADAMW)
            # FP32 rounding of the update: a few ulps of m, v and of the parameter (|p| <= ~1)
            np.testing.assert_allclose(m_got, m, rtol=1e-6, atol=1e-30, err_msg=f"AdamW m after step {t}")
            np.testing.assert_allclose(v_got, v, rtol=1e-6, atol=1e-30, err_msg=f"AdamW v after step {t}")
            np.testing.assert_allclose(p_got, p, rtol=1e-6, atol=1e-9, err_msg=f"parameters after step {t}")


# ---------------------------------------------------------------------------------------------
# bad inputs


def test_model_refuses_too_long_sequences_and_bad_token_ids():
    cfg = GPT2Config(max_seq_len=8, num_layers=1, num_heads=2, channels=8, vocab_size=100)
    model = GPT2(cfg, init_params(cfg))
    with pytest.raises(ModelError, match=r"T=9 is larger than the model's context \(max_seq_len=8\)"):
        model.forward(np.zeros((1, 9), np.int32))
    assert model.B is None, "a refused batch must not fix the model's shape"
    bad = np.zeros((2, 4), np.int32)
    bad[1, 2] = 100
    with pytest.raises(ModelError, match=r"input token id 100 at \(1, 2\) is outside the vocabulary \[0, 100\)"):
        model.forward(bad)
    bad[1, 2] = -1
    with pytest.raises(ModelError, match=r"input token id -1 .* outside the vocabulary"):
        model.forward(bad)
    targets = np.zeros((2, 4), np.int32)
    targets[0, 3] = 100
    with pytest.raises(ModelError, match=r"target token id 100 at \(0, 3\)"):
        model.forward(np.zeros((2, 4), np.int32), targets)
    with pytest.raises(ModelError, match=r"sized for B=2, T=4; got B=1, T=4"):
        model.forward(np.zeros((1, 4), np.int32))
    with pytest.raises(ModelError, match="backward needs a forward pass with targets"):
        model.backward()
    with pytest.raises(ModelError, match="parameters must be"):
        GPT2(cfg, np.zeros(10, np.float32))


def test_model_does_not_modify_the_callers_parameters():
    cfg = GPT2Config(max_seq_len=8, num_layers=1, num_heads=2, channels=8, vocab_size=100)
    params = init_params(cfg)
    before = params.copy()
    model = GPT2(cfg, params)
    model.params[...] = 0          # what update() does, without running a step
    assert np.array_equal(params, before)


# ---------------------------------------------------------------------------------------------
# the trainer: resume bit for bit, NaN loss


def _run_train(argv, monkeypatch):
    """llmcupy.train.main(argv) in-process: (exit code, stdout, stderr, [(what, step, loss)])."""
    from llmcupy import train

    seen = []
    check = getattr(train.check_loss, "__wrapped__", train.check_loss)   # not a previous call's recorder

    def recording(loss, step, what, *rest):
        seen.append((what, step, loss))
        return check(loss, step, what, *rest)

    recording.__wrapped__ = check

    monkeypatch.setattr(train, "check_loss", recording)
    # samples print token ids: the test is about the numbers, not the tokenizer
    monkeypatch.setattr(train, "load_tokenizer", lambda args: None)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = train.main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue(), seen


def _samples(stdout: str) -> list[str]:
    parts = stdout.split("generating:\n---\n")[1:]
    return [p.split("\n---\n")[0] for p in parts]


@pytest.fixture(scope="module")
def token_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(7)
    write_tokens(d / "train.bin", rng.integers(0, 50257, 1200))
    write_tokens(d / "val.bin", rng.integers(0, 50257, 200))
    return d


def _common_args(token_files):
    # d1 (one layer, C=64), B=1, T=16: a few tenths of a second per step in the emulator.
    # encoder_backward version 2 has no atomics, so the run is deterministic on a GPU too.
    return ["--init", "d1", "-b", 1, "-t", 16, "-i", token_files / "train.bin", "-j", token_files / "val.bin",
            "-m", 1, "--encoder-backward-kernel", 2]


def _state_arrays(path):
    s = ckpt.load_training_state(path)
    return s, {"params": s.params, "m": s.m, "v": s.v}


def test_resume_is_bit_for_bit(token_files, tmp_path, monkeypatch):
    common = _common_args(token_files) + ["-v", 2, "-s", 2, "-g", 3, "--save-every", 2]
    # the uninterrupted run: 4 steps, states at steps 2 and 4
    rc, full_out, _, full = _run_train(common + ["--steps", 4, "--save-path", tmp_path / "full.npz"], monkeypatch)
    assert rc == 0
    # an interrupted run: stops after 2 steps (its state saved at step 2), then is resumed to 4
    rc, _, _, first = _run_train(common + ["--steps", 2, "--save-path", tmp_path / "at2.npz"], monkeypatch)
    assert rc == 0
    # (what, step, loss): val at 0, train steps 1 and 2, val at 2 (then 3, 4 and val at 4)
    assert [e[:2] for e in full] == [("validation", 0), ("train", 1), ("train", 2), ("validation", 2),
                                     ("train", 3), ("train", 4), ("validation", 4)]
    assert first == full[:4]
    rc, resumed_out, _, resumed = _run_train(
        common + ["--steps", 4, "--resume", tmp_path / "at2.npz", "--save-path", tmp_path / "resumed.npz"], monkeypatch)
    assert rc == 0, resumed_out
    assert "resumed from" in resumed_out and "at step 2" in resumed_out
    # every loss from step 2 on (val at 2, train steps 3 and 4, val at 4) is bit-identical
    assert resumed == full[3:], (resumed, full[3:])
    # so are the samples drawn at steps 2 and 4 (the sampling RNG is part of the state)
    assert _samples(resumed_out) == _samples(full_out)[-2:] and len(_samples(resumed_out)) == 2
    # and the final states: parameters, AdamW moments, data-loader position, RNG
    s_full, a_full = _state_arrays(tmp_path / "full.npz")
    s_res, a_res = _state_arrays(tmp_path / "resumed.npz")
    assert s_full.step == s_res.step == 4
    for k in a_full:
        assert a_full[k].tobytes() == a_res[k].tobytes(), f"{k} differs after resuming"
    assert s_full.rng == s_res.rng
    assert repr(s_full.loaders) == repr(s_res.loaders)


def test_resume_refuses_a_state_of_another_model(token_files, tmp_path, monkeypatch):
    common = _common_args(token_files) + ["-v", 0, "-s", 0]
    rc, _, _, _ = _run_train(common + ["--steps", 1, "--save-every", 1, "--save-path", tmp_path / "d1.npz"],
                             monkeypatch)
    assert rc == 0
    argv = ["--init", "d2"] + common[2:] + ["--steps", 2, "--resume", tmp_path / "d1.npz"]
    rc, _, err, _ = _run_train(argv, monkeypatch)
    assert rc == 2 and "d1.npz" in err and "model" in err, err
    # same model, other batch shape: the data loader's position does not fit
    argv = common[:3] + [2] + common[4:] + ["--steps", 2, "--resume", tmp_path / "d1.npz"]
    rc, _, err, _ = _run_train(argv, monkeypatch)
    assert rc == 2 and "d1.npz" in err, err
    rc, _, err, _ = _run_train(common + ["--steps", 2, "--resume", tmp_path / "missing.npz"], monkeypatch)
    assert rc == 2 and "missing.npz" in err, err
    # a state past the run's last step
    rc, _, err, _ = _run_train(common + ["--steps", 0, "--resume", tmp_path / "d1.npz"], monkeypatch)
    assert rc == 2 and "is at step 1, past this run's last step 0" in err, err


def test_nan_loss_stops_and_keeps_the_last_state(token_files, tmp_path, monkeypatch):
    common = _common_args(token_files) + ["-v", 0, "-s", 0, "-o", tmp_path / "log.txt"]
    good = tmp_path / "good.npz"
    rc, _, _, _ = _run_train(common + ["--steps", 2, "--save-every", 2, "--save-path", good], monkeypatch)
    assert rc == 0
    before = good.read_bytes()
    # poison one parameter (a final-LayerNorm gain: every logit becomes NaN)
    state = ckpt.load_training_state(good)
    split_params(state.params, state.config)["lnfw"][0] = np.nan
    ckpt.save_training_state(tmp_path / "poisoned.npz", state)
    rc, out, err, seen = _run_train(common + ["--steps", 4, "--resume", tmp_path / "poisoned.npz",
                                              "--save-every", 1, "--save-path", good], monkeypatch)
    assert rc != 0
    assert seen and np.isnan(seen[-1][2])
    assert "train loss is nan at step 3" in err, err      # the third step, as the step lines count
    assert "step    3/4" not in out                       # no step line, no save (the loss is read after the update)
    assert good.read_bytes() == before, "the last saved state was overwritten"
    log = (tmp_path / "log.txt").read_text()
    assert "s:2 trl" not in log


def test_tf32_is_restored_after_train_main(token_files, monkeypatch):
    # --tf32 1 (the default) holds for the run only: a test after an in-process run starts with it
    # off. The emulator has no tensor cores, so the setting is forced "capable" here and its value
    # observed at every GEMM of the run.
    from llmcupy.runtime import blas

    monkeypatch.setattr(blas, "_tf32_capable", lambda: True)
    during = []
    numpy_gemm = blas._numpy_gemm
    monkeypatch.setattr(blas, "_numpy_gemm", lambda *a: (during.append(blas.tf32_enabled()), numpy_gemm(*a)))
    for flag, expected in ((1, True), (0, False)):
        during.clear()
        rc, out, err, _ = _run_train(_common_args(token_files) + ["-v", 0, "-s", 0, "--steps", 1, "--tf32", flag],
                                     monkeypatch)
        assert rc == 0, err
        assert during and set(during) == {expected}
        assert "TF32" in out and not blas.tf32_enabled()


class _CountingLosses(np.ndarray):
    """The model's per-token loss buffer, logging every host read of its values into LOG."""

    LOG: list = []

    def _read(self, name):
        _CountingLosses.LOG.append("read loss")

    def mean(self, *args, **kwargs):
        self._read("mean")
        return np.asarray(self).mean(*args, **kwargs)

    def __float__(self):
        self._read("float")
        return float(np.asarray(self))

    def get(self):
        self._read("get")
        return np.asarray(self).copy()


@pytest.mark.parametrize("flash", [False, True], ids=["attention", "flash"])
def test_backward_never_reads_a_stale_activation_gradient(flash):
    # zero_grad zeroes the parameter gradients and dres only: every other activation gradient must
    # be written before it is read (matmul_backward's overwrite_dinp, attention backward's outputs).
    # NaN left in them from "the last step" must not reach a gradient: bit-identical to clean buffers.
    cfg = GPT2Config(max_seq_len=16, num_layers=2, num_heads=2, channels=32, vocab_size=64)
    x, y = _batch(cfg, 2, 16, seed=5)
    grads = []
    for poison in (False, True):
        choice = KernelChoice()
        if flash:
            choice.set("flash_attention_forward", 1)
        model = GPT2(cfg, init_params(cfg, seed=3), choice)
        model.forward(x, y)
        model.zero_grad()
        if poison:
            for name, buf in model.dacts.items():
                # dpreatt's upper triangle is the attention driver's to keep zero (documented there)
                if name not in ("dres", "dpreatt"):
                    buf.fill(np.nan)
        model.backward()
        grads.append(model.grads_numpy().copy())
    assert np.isfinite(grads[0]).all()
    np.testing.assert_array_equal(grads[1], grads[0])


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
def test_a_training_step_runs_clean_under_the_sanitizers(fused, no_hazards):
    # The catalogue checks every version alone at its own sizes. A step chains the trainer's versions
    # on shared buffers (views of one parameter and one gradient allocation, gradients accumulated in
    # place, encoder_backward's and the bias gradients' atomics across blocks), where a race between
    # blocks of one kernel would show. racecheck (within and between blocks), memcheck and initcheck
    # must stay quiet, and the checked build must compute the plain build's loss.
    from llmcupy import sim
    from llmcupy.model import FUSION_OPS

    if not _backend.is_sim():
        pytest.skip("the sanitizers are the emulator's (on a GPU: compute-sanitizer)")
    cfg = GPT2Config(max_seq_len=16, num_layers=1, num_heads=2, channels=32, vocab_size=64)
    x, y = _batch(cfg, 2, 16, seed=5)
    losses = []
    for check in ("", "all"):
        choice = KernelChoice()
        for op in FUSION_OPS if fused else ():
            choice.set(op, llmcupy.ops.get(op).default_version)
        model = GPT2(cfg, init_params(cfg, seed=3), choice)
        with sim.settings(check=check):
            losses.append(model.train_step(x, y, 1e-3, 0.9, 0.999, 1e-8, 0.01, 1))
        assert np.isfinite(model.params_numpy()).all()
    # the same kernels; only the order of fp32 atomics may differ between the two runs
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)


def test_the_eager_step_reads_the_loss_once_after_the_backward():
    # A read of the loss between forward and backward would drain the GPU queue mid-step. The ops'
    # launches are logged through the profiler hook, the loss buffer's host reads by its class.
    from llmcupy.ops import _op

    cfg = GPT2Config(max_seq_len=16, num_layers=1, num_heads=2, channels=32, vocab_size=64)
    model = GPT2(cfg, init_params(cfg, seed=3))
    model.allocate(1, 8)
    model.acts["losses"] = model.acts["losses"].view(_CountingLosses)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (1, 9)).astype(np.int32)
    log = _CountingLosses.LOG
    log.clear()

    def hook(op, version, block_size, arrays):
        log.append(f"{_op.current_phase()}:{op.name}")
        return contextlib.nullcontext()

    _op.add_hook(hook)
    try:
        loss = model.train_step(tokens[:, :-1], tokens[:, 1:], 1e-3, 0.9, 0.999, 1e-8, 0.0, 1)
    finally:
        _op.remove_hook(hook)
    assert log.count("read loss") == 1, log
    assert log[-1] == "read loss"  # after every launch: forward, backward and the update
    assert any(e.startswith("backward blocks:") for e in log) and any(e.startswith("optimizer:") for e in log)
    assert np.isfinite(loss) and loss == model.mean_loss


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # lr as an FP32 scalar
def test_diverging_parameters_are_not_saved(token_files, tmp_path, monkeypatch):
    # lr = 1e39 overflows FP32: the first update makes the parameters inf/NaN while that step's loss
    # (computed before the update) is still finite. The save at step 1 must refuse them.
    common = _common_args(token_files) + ["-v", 0, "-s", 0]
    path = tmp_path / "state.npz"
    rc, out, err, seen = _run_train(common + ["--steps", 3, "-l", 1e39, "--save-every", 1, "--save-path", path],
                                    monkeypatch)
    assert rc == 3, out + err
    assert np.isfinite(seen[0][2])
    assert "parameters are not finite after step 1" in err, err
    assert not path.exists()


class OutOfMemoryError(Exception):
    """Stands in for cupy.cuda.memory.OutOfMemoryError (matched by name, as the model does)."""


def test_out_of_memory_names_the_buffer_and_suggests_a_smaller_batch(monkeypatch):
    cfg = GPT2Config(max_seq_len=16, num_layers=1, num_heads=2, channels=8, vocab_size=100)
    params = init_params(cfg)
    model = GPT2(cfg, params)

    def no_memory(*args, **kwargs):
        raise OutOfMemoryError("out of memory allocating 1,234,567,890 bytes")

    monkeypatch.setattr(model.xp, "zeros", no_memory)
    with pytest.raises(ModelError, match=r"out of memory allocating the activations for B=2, T=8 .*smaller batch \(-b\)"):
        model.allocate(2, 8)
    # the parameters: the trainer's catch-all said "during a step; try a smaller batch", which cannot help
    monkeypatch.setattr(model.xp, "array", no_memory)
    with pytest.raises(ModelError, match=r"allocating the model's 2,040 parameters .*the model alone does not fit"):
        GPT2(cfg, params)
