"""CUDA graphs in the trainer (--cuda-graph): capturable AdamW, graph-safe op launches, StepGraph.

In the emulator (no graphs) a StepGraph's replay runs the very step code a GPU captures, through
the same graph-safe path (no host checks, sealed scratch workspace, AdamW state in device memory):

* op adamw_capturable equals the eager adamw bit for bit over several steps (versions 1 and 2,
  weight decay, an lr change, steps across the end of the bias-correction table);
* a StepGraph run equals eager steps bit for bit (losses, parameters, moments, gradients), with
  the token and target buffers made unreadable on the host (any value read raises), and a replay
  allocates no array (tracemalloc's peak stays at the emulator's own bookkeeping);
* ``python -m llmcupy.train --cuda-graph`` prints the same losses as without, bit for bit;
* Op.run's host_checks=False / graph_safe skip the value checks (token ids, targets) and nothing
  else; a graph-safe op refuses to allocate outputs; a sealed workspace refuses new scratch.

The ``gpu`` tests (skipped without a device) capture and replay a step on a GPU.
"""

from __future__ import annotations

import io
import re
import tracemalloc
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest

import llmcupy
from llmcupy import sim
from llmcupy.config import GPT2Config, init_params
from llmcupy.data import write_tokens
from llmcupy.model import GPT2, KernelChoice, ModelError
from llmcupy.ops import OpError, check_outputs
from llmcupy.ops._op import Workspace, graph_safe, host_checks, host_checks_enabled, scratch
from llmcupy.ops.adamw import bias_corrections
from llmcupy.ops.adamw_capturable import C1, C2, LR, AdamWDeviceState, correction_table

ADAMW = llmcupy.ops["adamw"]
CAPTURABLE = llmcupy.ops["adamw_capturable"]

# one layer, C = 64, the real vocabulary: a few tenths of a second per step in the emulator
SMALL = GPT2Config(max_seq_len=32, num_layers=1, num_heads=2, channels=64)
HP = (3e-4, 0.9, 0.999, 1e-8, 0.01)  # lr, beta1, beta2, eps, weight_decay (decay on: exercised)


def _bytes(a) -> bytes:
    return np.ascontiguousarray(llmcupy.to_numpy(a)).tobytes()


class HostRead(AssertionError):
    pass


class NoHostRead(np.ndarray):
    """A buffer whose values the host must not read (a device buffer while a graph is captured):
    ufuncs (comparisons, min/max), reductions, conversions and element reads raise HostRead.
    Kernels still get its address, and set_batch may write it."""

    def _refuse(self, *args, **kwargs):
        raise HostRead("a host read of a device buffer's values")

    def __array_ufunc__(self, *args, **kwargs):
        raise HostRead("a ufunc on a device buffer's values on the host")

    def __array_function__(self, *args, **kwargs):
        raise HostRead("a NumPy function on a device buffer's values on the host")

    min = max = any = all = sum = mean = item = tolist = argmax = argmin = _refuse
    __bool__ = __int__ = __float__ = __index__ = __getitem__ = __iter__ = _refuse


def _batches(cfg, B, T, n, seed=3):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        tok = rng.integers(0, cfg.vocab_size, (B, T + 1)).astype(np.int32)
        out.append((tok[:, :-1].copy(), tok[:, 1:].copy()))
    return out


# -- adamw_capturable ---------------------------------------------------------------------------


def test_correction_table_holds_the_eager_values_until_both_are_one():
    table = correction_table(0.9, 0.999)
    L = table.shape[1]
    assert table.dtype == np.float32 and table.shape == (2, L) and L == 17321
    for t in (1, 2, 10, 165, 1000, L - 1, L):
        c1, c2 = bias_corrections(0.9, 0.999, t)
        assert table[0, t - 1].tobytes() == c1.tobytes() and table[1, t - 1].tobytes() == c2.tobytes(), t
    assert table[1, L - 2] < 1.0 and table[0, L - 1] == table[1, L - 1] == 1.0
    # past the end the eager values stay 1.0f: what the kernel's clamp returns
    for t in range(L, L + 2000, 7):
        assert bias_corrections(0.9, 0.999, t) == (1.0, 1.0)
    assert correction_table(0.0, 0.0).shape == (2, 1)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("t0", [1, 17318])  # from the start; across the table's end (L = 17321)
def test_capturable_adamw_is_bit_identical_to_eager(version, t0, no_hazards):
    rng = np.random.default_rng(version)
    n = 2000
    params = rng.uniform(-1, 1, n).astype(np.float32)
    m = rng.uniform(-0.1, 0.1, n).astype(np.float32) if t0 > 1 else np.zeros(n, np.float32)
    v = rng.uniform(0, 0.01, n).astype(np.float32) if t0 > 1 else np.zeros(n, np.float32)
    eager = [params.copy(), m.copy(), v.copy()]
    device = [params.copy(), m.copy(), v.copy()]
    lr, b1, b2, eps, wd = HP
    state = AdamWDeviceState(lr, b1, b2, eps, wd, t=t0)
    for k in range(7):
        if k == 4:  # a new learning rate from step 5 on: written into hyper, nothing else changes
            lr = 1e-3
            state.set(lr=lr)
        grads = rng.uniform(-1, 1, n).astype(np.float32)
        ADAMW(*eager[:1], grads, *eager[1:], lr, b1, b2, eps, wd, t0 + k, version=version)
        CAPTURABLE(device[0], grads, device[1], device[2], **state.arrays(), version=version)
        for name, a, b in zip(("params", "m", "v"), eager, device):
            assert a.tobytes() == b.tobytes(), f"{name} differs at step {t0 + k}"
        c1, c2 = bias_corrections(b1, b2, t0 + k)
        assert state.hyper[C1] == c1 and state.hyper[C2] == c2 and state.hyper[LR] == np.float32(lr)
    assert state.t == t0 + 6


def test_capturable_adamw_refuses_bad_state():
    a = CAPTURABLE.make_inputs(np.random.default_rng(0), P=10)
    with pytest.raises(OpError, match="step must be an int32 array"):
        CAPTURABLE(**{**a, "step": np.array([1], np.int64)})
    with pytest.raises(OpError, match="hyper must be float32"):
        CAPTURABLE(**{**a, "hyper": np.zeros(7, np.float32)})
    with pytest.raises(OpError, match="corrections must be"):
        CAPTURABLE(**{**a, "corrections": np.ones(5, np.float32)})
    with pytest.raises(OpError, match="beta2"):
        AdamWDeviceState(3e-4, 0.9, 1.0, 1e-8, 0.0)
    with pytest.raises(OpError, match="do not reach 1.0f"):
        correction_table(0.9, 0.99999999, max_len=1000)


# -- Op.run's host checks, workspace, refused allocations ---------------------------------------


def test_host_checks_off_skips_only_the_value_checks():
    enc = llmcupy.ops["encoder_forward"]
    a = enc.make_inputs(np.random.default_rng(0), B=2, T=4, C=8, V=11)
    bad = {**a, "tokens": np.full((2, 4), 11, np.int32)}
    with pytest.raises(OpError, match="token id 11 is out of range"):
        enc.validate_fn(bad)
    assert host_checks_enabled()
    with host_checks(False):
        assert not host_checks_enabled()
        enc.validate_fn(bad)  # the value check is skipped ...
        with pytest.raises(OpError, match="int32"):  # ... the dtype and shape checks are not
            enc.validate_fn({**a, "tokens": a["tokens"].astype(np.int64)})
    assert host_checks_enabled()
    ce = llmcupy.ops["classifier_fused"]
    c = ce.make_inputs(np.random.default_rng(0), B=2, T=3, V=10)
    bad_targets = {**c, "targets": np.full((2, 3), 10, np.int32)}
    with pytest.raises(OpError, match="targets must lie in"):
        ce.validate_fn(bad_targets)
    with host_checks(False):
        ce.validate_fn(bad_targets)


@pytest.mark.parametrize("op_name", ["encoder_forward", "encoder_backward", "classifier_fused"])
def test_run_without_host_checks_never_reads_ids(op_name, no_hazards):
    op = llmcupy.ops[op_name]
    sizes = {"encoder_forward": dict(B=2, T=4, C=8, V=11), "encoder_backward": dict(B=2, T=4, C=8, V=11),
             "classifier_fused": dict(B=2, T=3, V=10)}[op_name]
    a = op.make_inputs(np.random.default_rng(0), **sizes)
    key = "targets" if op_name == "classifier_fused" else "tokens"
    ref = op.reference_fn(**{k: (np.array(x, copy=True) if isinstance(x, np.ndarray) else x) for k, x in a.items()})
    with pytest.raises(HostRead):  # with the checks on, validation reads the ids (the detector works)
        op.run(None, {**a, key: a[key].view(NoHostRead)})
    arrays = {k: (np.array(x, copy=True) if isinstance(x, np.ndarray) else x) for k, x in a.items()}
    arrays[key] = arrays[key].view(NoHostRead)
    got = op.run(None, arrays, host_checks=False)
    for result in check_outputs(op, ref, got):
        assert result["ok"], result


def test_graph_safe_runs_refuse_allocations():
    res = llmcupy.ops["residual_forward"]
    a = res.make_inputs(np.random.default_rng(0), B=1, T=2, C=8)
    ws = Workspace()
    with graph_safe(ws):
        with pytest.raises(OpError, match="allocates an output inside a graph-safe"):
            res.run(None, a)  # no out=: it would allocate
        res.run(None, a, out={"out": np.empty((1, 2, 8), np.float32)})
        first = scratch("x", "buf", (3, 4), fill=0.0)
        assert scratch("x", "buf", (3, 4)) is first and len(ws) == 1 and ws.nbytes == 48
        ws.sealed = True
        assert scratch("x", "buf", (3, 4)) is first
        with pytest.raises(OpError, match="was not allocated by the warm-up step"):
            scratch("x", "other", (3, 4))
    assert scratch("x", "buf", (3, 4)) is not first  # outside graph_safe: a fresh array


def test_graph_safe_runs_skip_the_profiler_hooks():
    seen = []

    def hook(op, version, block_size, arrays):
        seen.append(op.name)
        import contextlib

        return contextlib.nullcontext()

    res = llmcupy.ops["residual_forward"]
    a = res.make_inputs(np.random.default_rng(0), B=1, T=2, C=8)
    llmcupy.ops.add_hook(hook)
    try:
        res.run(None, a)
        with graph_safe(Workspace()):
            res.run(None, a, out={"out": np.empty((1, 2, 8), np.float32)})
    finally:
        llmcupy.ops.remove_hook(hook)
    assert seen == ["residual_forward"]


# -- the model's StepGraph ----------------------------------------------------------------------


def _eager_run(cfg, params, batches, kernels=None):
    model = GPT2(cfg, params.copy(), kernels)
    losses = []
    for i, (x, y) in enumerate(batches):
        losses.append(model.forward(x, y))
        model.zero_grad()
        model.backward()
        model.update(*HP, i + 1)
    return model, losses


def test_step_graph_equals_eager_steps_bit_for_bit(no_hazards):
    B, T = 1, 16
    batches = _batches(SMALL, B, T, 3)
    params = init_params(SMALL, seed=1)
    with sim.settings(workers=1):  # one worker: the atomics (encoder_backward 1) add in one order
        eager, eager_losses = _eager_run(SMALL, params, batches)
        model = GPT2(SMALL, params.copy())
        model.allocate(B, T)
        # the graph path may not read the ids on the host: set_batch checked them
        model.tokens = model.tokens.view(NoHostRead)
        model.targets = model.targets.view(NoHostRead)
        graph = model.step_graph(*HP, t=1)
        assert graph.emulated and not graph.captured
        losses = []
        for x, y in batches:
            model.set_batch(x, y)
            losses.append(graph.step())
    assert graph.warmed_up and graph.replays == 2 and graph.t == 3 and graph.workspace.sealed
    assert "emulated" in graph.capture_mode
    assert len(graph.workspace) > 0  # attention's temporaries (Q, K, V, dY, ... per head)
    assert [np.float32(v).tobytes() for v in losses] == [np.float32(v).tobytes() for v in eager_losses]
    for name in ("params", "grads", "m", "v"):
        assert _bytes(getattr(model, name)) == _bytes(getattr(eager, name)), name
    assert model.mean_loss == losses[-1]


def test_step_graph_with_other_versions(no_hazards):
    # the capturable AdamW follows the version chosen for adamw; other scratch users swapped in
    kernels = KernelChoice()
    for op, n in (("adamw", 1), ("attention_forward", 2), ("layernorm_backward", 5), ("encoder_backward", 2)):
        kernels.set(op, n)
    B, T = 1, 8
    batches = _batches(SMALL, B, T, 3, seed=5)
    params = init_params(SMALL, seed=2)
    with sim.settings(workers=1):
        eager, eager_losses = _eager_run(SMALL, params, batches, kernels)
        model = GPT2(SMALL, params.copy(), kernels)
        graph = model.step_graph(*HP)
        losses = []
        for x, y in batches:
            model.set_batch(x, y)
            losses.append(graph.step())
    assert losses == eager_losses
    assert _bytes(model.params) == _bytes(eager.params)


def test_a_replay_allocates_nothing():
    B, T = 1, 16
    (x, y), = _batches(SMALL, B, T, 1)
    model = GPT2(SMALL, init_params(SMALL, seed=1))
    model.allocate(B, T)
    graph = model.step_graph(*HP)
    model.set_batch(x, y)
    graph.step()  # warm-up: the workspace's buffers are allocated here
    tracemalloc.start()
    try:
        model.set_batch(x, y)
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        graph.replay()
        _, replay_peak = tracemalloc.get_traced_memory()
        base2, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        control = np.ones((B * T, SMALL.padded_vocab_size), np.float32)  # one LM-head-sized temporary
        _, control_peak = tracemalloc.get_traced_memory()
        del control
    finally:
        tracemalloc.stop()
    # The control shows the measurement sees an array the size of the LM head's logits (B*T x Vp
    # float32: 3.2 MB), the smallest temporary a GEMM of the head would need. A replay allocates no
    # array: what remains is the emulator's per-launch bookkeeping (0-d scalar arrays, ctypes
    # argument lists; ~30 KiB), and runtime.blas keeps its NumPy product buffers across calls as
    # cuBLAS keeps its workspace.
    assert control_peak - base2 > 3 * 2**20
    assert replay_peak - base < 256 * 2**10, f"a replay allocated {replay_peak - base} bytes"


def test_graph_step_issues_every_gemm_through_runtime_blas(monkeypatch):
    # CuPy refuses cuBLAS calls during stream capture, so a captured step must never reach
    # xp.matmul (numpy.matmul here: the emulator's xp). The emulator's blas binds NumPy's matmul at
    # import, so patching the module attribute catches exactly the ops' own calls.
    from llmcupy.runtime import blas

    def refuse(*args, **kwargs):
        raise AssertionError("xp.matmul called in a graph-safe step (CuPy's cuBLAS cannot be captured)")

    B, T = 1, 8
    (x, y), = _batches(SMALL, B, T, 1)
    model = GPT2(SMALL, init_params(SMALL, seed=1))
    model.allocate(B, T)
    graph = model.step_graph(*HP)
    model.set_batch(x, y)
    record = []
    monkeypatch.setattr(np, "matmul", refuse)
    monkeypatch.setattr(blas, "RECORD", record)
    graph.step()
    graph.replay()
    # per step and layer: 4 dense layers forward, 2 attention GEMMs forward, 2 GEMMs per dense layer
    # backward and 4 attention GEMMs backward; the LM head's forward and its 2 backward GEMMs
    per_step = SMALL.num_layers * (4 + 2 + 4 * 2 + 4) + 1 + 2
    assert len(record) == 2 * per_step
    batched = [c for c, _ in record if c.batch > 1]
    assert len(batched) == 2 * SMALL.num_layers * 6 and all(c.batch == B * SMALL.num_heads for c in batched)


def test_step_graph_needs_targets_and_a_capture_first():
    B, T = 1, 8
    (x, y), = _batches(SMALL, B, T, 1)
    model = GPT2(SMALL, init_params(SMALL, seed=1))
    graph = model.step_graph(*HP)
    with pytest.raises(ModelError, match="needs a batch with targets"):
        graph.step()
    model.set_batch(x)
    with pytest.raises(ModelError, match="needs a batch with targets"):
        graph.step()
    with pytest.raises(ModelError, match="capture"):
        graph.replay()
    model.set_batch(x, y)
    graph.capture()
    with pytest.raises(ModelError, match="already captured"):
        graph.capture()
    # eager forwards between replays (validation, sampling) and then a replay again
    model.forward(x)
    model.set_batch(x, y)
    assert np.isfinite(graph.replay())


# -- the trainer ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def token_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("graph_tokens")
    rng = np.random.default_rng(11)
    write_tokens(d / "train.bin", rng.integers(0, 50257, 1200))
    write_tokens(d / "val.bin", rng.integers(0, 50257, 200))
    return d


def _train(argv, monkeypatch):
    from llmcupy import train

    monkeypatch.setattr(train, "load_tokenizer", lambda args: None)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = train.main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


STEP_LINE = re.compile(r"step +(\d+)/\d+: train loss (\S+) ")
VAL_LINE = re.compile(r"val loss (\S+)")


def test_train_cli_with_cuda_graph_gives_the_same_losses(token_files, monkeypatch):
    common = ["--init", "d1", "-b", 1, "-t", 16, "-i", token_files / "train.bin", "-j", token_files / "val.bin",
              "-m", 1, "-v", 2, "-s", 2, "-g", 3, "--steps", 4, "--weight-decay", 0.01]
    with sim.settings(workers=1):
        rc, eager_out, err = _train(common, monkeypatch)
        assert rc == 0, err
        rc, graph_out, err = _train(common + ["--cuda-graph"], monkeypatch)
        assert rc == 0, err
    assert "CUDA graph: the training step is captured" in graph_out and "emulator" in graph_out
    eager_steps, graph_steps = STEP_LINE.findall(eager_out), STEP_LINE.findall(graph_out)
    assert len(eager_steps) == 4 and graph_steps == eager_steps
    assert VAL_LINE.findall(graph_out) == VAL_LINE.findall(eager_out) and len(VAL_LINE.findall(eager_out)) == 3
    # the samples at steps 2 and 4 (eager forwards between graph replays) too
    assert graph_out.split("generating:")[1:] and [s.split("---")[1] for s in graph_out.split("generating:")[1:]] \
        == [s.split("---")[1] for s in eager_out.split("generating:")[1:]]


def test_benchmark_with_cuda_graph(token_files, monkeypatch):
    argv = ["--init", "d1", "-b", 1, "-t", 8, "-i", token_files / "train.bin", "--benchmark", "--warmup", 1,
            "--steps", 2]
    with sim.settings(workers=1):
        rc, eager_out, err = _train(argv, monkeypatch)
        assert rc == 0, err
        rc, out, err = _train(argv + ["--cuda-graph"], monkeypatch)
        assert rc == 0, err
    assert re.search(r"benchmark: B=1 T=8, 2 steps after 1 warm-up: mean [\d.]+ ms/step, .* tok/s with the CUDA "
                     r"graph \(emulated: eager launches\)", out), out
    # the two timed steps (no step line matched in both passed as equal before)
    assert len(STEP_LINE.findall(eager_out)) == 2, eager_out
    assert STEP_LINE.findall(out) == STEP_LINE.findall(eager_out)


# -- on a GPU -------------------------------------------------------------------------------------


@pytest.fixture
def cuda():
    llmcupy.set_backend("cuda")
    yield
    llmcupy.set_backend("sim")


@pytest.mark.gpu
@pytest.mark.parametrize("version", [1, 2])
def test_gpu_capturable_adamw_is_bit_identical_to_eager(cuda, version):
    import cupy

    rng = np.random.default_rng(0)
    n = 1 << 20
    host = [rng.uniform(-1, 1, n).astype(np.float32), np.zeros(n, np.float32), np.zeros(n, np.float32)]
    eager = [cupy.asarray(a) for a in host]
    device = [cupy.asarray(a) for a in host]
    state = AdamWDeviceState(*HP, t=1)
    for t in range(1, 6):
        g = cupy.asarray(rng.uniform(-1, 1, n).astype(np.float32))
        ADAMW(eager[0], g, eager[1], eager[2], *HP, t, version=version)
        CAPTURABLE(device[0], g, device[1], device[2], **state.arrays(), version=version)
    for a, b in zip(eager, device):
        assert cupy.asnumpy(a).tobytes() == cupy.asnumpy(b).tobytes()


def _gpu_runs(cfg, B, T, steps, kernels):
    """Eager steps and StepGraph steps from the same parameters and batches: losses and models."""
    import cupy

    batches = _batches(cfg, B, T, steps, seed=9)
    params = init_params(cfg, seed=1)
    eager, eager_losses = _eager_run(cfg, params, batches, kernels)
    model = GPT2(cfg, params.copy(), kernels)
    graph = model.step_graph(*HP, t=1)
    losses = []
    for x, y in batches:
        model.set_batch(x, y)
        losses.append(graph.step())
    cupy.cuda.get_current_stream().synchronize()
    return eager, eager_losses, model, graph, losses


@pytest.mark.gpu
def test_gpu_step_graph_replays_match_eager(cuda):
    # Deterministic versions (encoder_backward 2: no atomics; the rest of the default step has
    # none that change the order of float additions run to run, and cuBLAS is deterministic for a
    # given stream, workspace and shape). The graph replays the warm-up's kernels with the same
    # arguments, so the step is the same computation: exact equality is expected. Were cuBLAS to
    # pick another GEMM algorithm under capture, the sums would be reordered: a few ulps in the
    # gradients and losses equal to ~1e-6 relative; the looser assertions below state that bound,
    # and the printout says which case it was.
    kernels = KernelChoice()
    kernels.set("encoder_backward", 2)
    cfg = GPT2Config(max_seq_len=64, num_layers=2, num_heads=4, channels=128)
    eager, eager_losses, model, graph, losses = _gpu_runs(cfg, 4, 64, 6, kernels)
    assert graph.captured and not graph.emulated and graph.replays == 5 and graph.t == 6
    exact = losses == eager_losses and _bytes(model.params) == _bytes(eager.params)
    print(f"\ncapture mode: {graph.capture_mode}; CuPy allocations during capture: "
          f"{len(graph.capture_allocations)} ({graph.capture_bytes} bytes); "
          f"workspace: {len(graph.workspace)} buffers, {graph.workspace.nbytes} bytes; bit-identical: {exact}")
    print("eager losses:", eager_losses)
    print("graph losses:", losses)
    if exact:
        return
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5, atol=0)
    # A parameter whose gradient cancels to rounding level can flip the sign of its AdamW step, so
    # single elements may differ by up to a few lr per step; all but a few must agree closely.
    diff = np.abs(llmcupy.to_numpy(model.params) - llmcupy.to_numpy(eager.params))
    assert diff.max() <= 8 * HP[0] * len(losses) and np.mean(diff > 1e-6) < 1e-3


@pytest.mark.gpu
def test_gpu_capture_is_thread_local_and_allocates_nothing(cuda):
    # With every GEMM on our own cuBLAS handle (bound to the stream before the capture) and every
    # temporary in the workspace, the strict mode captures and nothing is allocated inside it: an
    # allocation in relaxed mode would be held for the graph's life (GBs at B=4, T=1024).
    cfg = GPT2Config(max_seq_len=64, num_layers=2, num_heads=4, channels=128)
    (x, y), = _batches(cfg, 2, 64, 1, seed=6)
    model = GPT2(cfg, init_params(cfg, seed=1))
    graph = model.step_graph(*HP, t=1)
    model.set_batch(x, y)
    graph.step()
    assert graph.captured
    assert graph.capture_mode == "thread-local", graph.capture_mode
    assert graph.capture_bytes == 0 and graph.capture_allocations == []


@pytest.mark.gpu
def test_gpu_step_graph_default_kernels_and_timing(cuda):
    """The default kernel choice (atomics in encoder_backward: last bits may differ run to run)
    and ms/step with and without the graph on a small GPT-2 (d2, B=4, T=256)."""
    import time

    import cupy

    cfg = GPT2Config.preset("d2")
    B, T, steps = 4, 256, 20
    (x, y), = _batches(cfg, B, T, 1, seed=4)
    params = init_params(cfg, seed=1)

    def timed(run_step):
        times = []
        for i in range(steps + 2):
            cupy.cuda.get_current_stream().synchronize()
            t0 = time.perf_counter()
            loss = run_step(i)
            cupy.cuda.get_current_stream().synchronize()
            if i >= 2:
                times.append((time.perf_counter() - t0) * 1e3)
        return loss, float(np.mean(times))

    eager = GPT2(cfg, params.copy())

    def eager_step(i):
        loss = eager.forward(x, y)
        eager.zero_grad()
        eager.backward()
        eager.update(*HP, i + 1)
        return loss

    model = GPT2(cfg, params.copy())
    graph = model.step_graph(*HP, t=1)

    def graph_step(i):
        model.set_batch(x, y)
        return graph.step()

    eager_loss, eager_ms = timed(eager_step)
    graph_loss, graph_ms = timed(graph_step)
    print(f"\nd2 B={B} T={T}: eager {eager_ms:.3f} ms/step, CUDA graph {graph_ms:.3f} ms/step "
          f"({graph.capture_mode}); last losses {eager_loss} / {graph_loss}")
    assert graph.captured
    assert abs(graph_loss - eager_loss) <= 1e-4 * abs(eager_loss)  # 22 steps; only atomics' order differs


@pytest.mark.gpu
def test_gpu_train_benchmark_prints_graph_ms_per_step(cuda, token_files, monkeypatch):
    argv = ["--backend", "cuda", "--init", "d2", "-b", 4, "-t", 128, "-i", token_files / "train.bin",
            "--benchmark", "--warmup", 2, "--steps", 5]
    rc, eager_out, err = _train(argv, monkeypatch)
    assert rc == 0, err
    rc, out, err = _train(argv + ["--cuda-graph"], monkeypatch)
    assert rc == 0, err
    line = [s for s in out.splitlines() if s.startswith("benchmark:")][0]
    print("\n" + [s for s in eager_out.splitlines() if s.startswith("benchmark:")][0] + "\n" + line)
    assert "with the CUDA graph" in line and "emulated" not in line
