"""python -m llmcupy.test_gpt2: the correctness gate of the FP32 trainer (llm.c's test_gpt2_fp32).

    python -m llmcupy.test_gpt2 --checkpoint gpt2_124M.bin --debug-state gpt2_124M_debug_state.bin
    python -m llmcupy.test_gpt2 ... --kernel attention_backward=7 --matmul-kernel 4

Runs the debug state's batch through the model with TF32 off and compares:
1. the logits (first V of every row) with the reference: |diff| < 1e-2, llm.c's tolerance;
2. the step-0 loss: |diff| < 1e-2;
3. every gradient tensor: max |diff| <= 1e-2 (llm.c's absolute tolerance) and <= 1e-2 * max|ref|
   + 1e-6 (so that it also means something for small models whose gradients are tiny);
4. ten AdamW steps on the same batch (lr 1e-4, weight decay 0.01): the losses must fall (the last
   below the first; not every step: a random-init GPT-2 124M overshoots once in PyTorch too), and
   match ``--expected-losses`` within 1e-2 when given (``llmc`` = the values llm.c hard-codes for
   GPT-2 124M with its starter-pack debug state, or a JSON list such as ``torch_gpt2`` writes).
Prints ``overall okay: 1`` and exits 0 only if all of these hold.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

import numpy as np

from . import checkpoint as ckpt
from . import ops as ops_registry
from .config import PARAM_NAMES, split_params
from .fileio import FileFormatError
from .model import GPT2, STEP_OPS, ModelError
from .runtime import backend as _backend
from .runtime import blas
from .train import kernel_choice, kernel_flag
from ._cli import one_line_warnings

LLMC_EXPECTED_LOSSES = [5.270007133483887, 4.059706687927246, 3.3751230239868164, 2.8007826805114746,
                        2.315382242202759, 1.8490285873413086, 1.3946564197540283, 0.9991465210914612,
                        0.6240804195404053, 0.37651097774505615]
LOGITS_TOL = 1e-2
LOSS_TOL = 1e-2
GRAD_ABS_TOL = 1e-2
GRAD_REL_TOL = 1e-2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m llmcupy.test_gpt2", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", "-e", default="gpt2_124M.bin",
                   help="llm.c model .bin (or a training state .npz written by the trainer)")
    p.add_argument("--debug-state", "-d", default="gpt2_124M_debug_state.bin", help="llm.c debug-state .bin")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--expected-losses", default=None, help="'llmc' or a JSON file with the step losses")
    p.add_argument("--backend", choices=_backend.CHOICES, default=None)
    for op in STEP_OPS:
        p.add_argument(kernel_flag(op), dest=f"kernel_{op}", type=int, metavar="N", help=f"{op} version")
    p.add_argument("--fused", action="store_true",
                   help="every fusion (fused residual + LayerNorm, matmul with GELU epilogue, flash attention)")
    p.add_argument("--kernel", action="append", default=[], metavar="OP=N[:BLOCK]")
    return p


def losses_fall(losses) -> bool:
    """All finite and the last below the first (single steps may overshoot)."""
    return bool(np.isfinite(losses).all()) and (len(losses) < 2 or losses[-1] < losses[0])


def compare_grads(cfg, grads: np.ndarray, ref: np.ndarray) -> tuple[bool, list]:
    ok, rows = True, []
    mine, theirs = split_params(grads, cfg), split_params(ref, cfg)
    for name in PARAM_NAMES:
        diff = float(np.max(np.abs(mine[name].astype(np.float64) - theirs[name])))
        scale = float(np.max(np.abs(theirs[name])))
        tol = min(GRAD_ABS_TOL, GRAD_REL_TOL * scale + 1e-6)
        good = diff <= tol and bool(np.isfinite(mine[name]).all())
        ok &= good
        rows.append((name, diff, scale, tol, good))
    return ok, rows


def load_expected_losses(spec: str | None) -> list[float] | None:
    """``llmc``, or a JSON file holding a list of numbers; checked before any work is done."""
    if not spec:
        return None
    if spec == "llmc":
        return list(LLMC_EXPECTED_LOSSES)
    try:
        with open(spec) as f:
            expected = json.load(f)
    except ValueError as exc:  # json.JSONDecodeError
        raise ckpt.CheckpointError(f"{spec}: not a JSON list of losses ({exc})") from exc
    if (not isinstance(expected, list) or not expected
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in expected)):
        raise ckpt.CheckpointError(f"{spec}: expected a non-empty JSON list of numbers (the step losses)")
    return [float(v) for v in expected]


def run_gate(args) -> int:
    with contextlib.ExitStack() as scope:
        return _run_gate(args, scope)


def _run_gate(args, scope: contextlib.ExitStack) -> int:
    if args.backend:
        _backend.set_backend(args.backend)
    kernels = kernel_choice(args)
    expected = load_expected_losses(args.expected_losses)
    cfg, params, _ = ckpt.read_model_any(args.checkpoint)
    ckpt.check_readable_file(args.debug_state, "an llm.c debug-state .bin")
    state = ckpt.read_debug_state(args.debug_state, cfg)
    B, T, V = state.B, state.T, cfg.vocab_size
    if T > cfg.max_seq_len:
        raise ModelError(f"the debug state's T={T} is larger than the model's context {cfg.max_seq_len}")
    scope.enter_context(blas.tf32(False))  # the gate compares exact FP32 (restored after the gate)
    print(f"[GPT-2] max_seq_len {cfg.max_seq_len}, vocab {V} (padded {cfg.padded_vocab_size}), layers "
          f"{cfg.num_layers}, heads {cfg.num_heads}, channels {cfg.channels}; batch B={B}, T={T}; "
          f"backend {_backend.get_backend()}")
    for op, n, summary in kernels.table():
        print(f"  {op:<20} {n:>3}  {summary}")
    model = GPT2(cfg, params, kernels)

    # 1. logits of a forward pass without targets
    model.forward(state.x)
    logits = _backend.to_numpy(model.logits()).astype(np.float32)
    diff = np.abs(logits.astype(np.float64) - state.logits)
    logits_ok = bool(np.isfinite(logits).all()) and float(diff.max()) < LOGITS_TOL
    for i in range(min(10, logits.size)):
        print(f"{state.logits.reshape(-1)[i]:f} {logits.reshape(-1)[i]:f}")
    print(f"logits max abs diff {float(diff.max()):.3e}")
    print("OK (LOGITS)" if logits_ok else "NOT OK (LOGITS)")

    # 2-4. ten training steps on the same batch
    losses, loss_ok, grads_ok = [], False, False
    for step in range(args.steps):
        t0 = time.perf_counter()
        loss = model.forward(state.x, state.y)
        model.zero_grad()
        model.backward()
        _backend.synchronize()
        if step == 0:
            loss_ok = abs(loss - state.loss) < LOSS_TOL
            print(f"loss {loss:f} reference {state.loss:f}: {'LOSS OK' if loss_ok else 'LOSS MISMATCH'}")
            grads_ok, rows = compare_grads(cfg, model.grads_numpy(), state.grads)
            for name, d, scale, tol, good in rows:
                print(f"  {name:<9} max abs diff {d:.3e} (max |ref| {scale:.3e}, tolerance {tol:.1e}) "
                      f"{'TENSOR OK' if good else 'TENSOR NOT OK'}")
            print("OK (GRADS)" if grads_ok else "NOT OK (GRADS)")
        model.update(1e-4, 0.9, 0.999, 1e-8, 0.01, step + 1)
        _backend.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        losses.append(loss)
        print(f"step {step}: loss {loss:f} (took {ms:f} ms)")

    # Training on one batch must make progress. Not every step has to: on a random-init GPT-2 124M,
    # PyTorch's AdamW itself goes 8.04 -> 9.67 at step 3 before falling to 4.47 by step 9.
    steps_ok = losses_fall(losses)
    print("step losses decrease: " + ("OK" if steps_ok else "NOT OK") + " (last below first)")
    if expected is not None:
        for i, (got, want) in enumerate(zip(losses, expected)):
            good = abs(got - want) < LOSS_TOL
            steps_ok &= good
            print(f"  step {i}: loss {got:f} expected {want:f} {'OK' if good else 'MISMATCH'}")
        if len(expected) < len(losses):
            print(f"  (only {len(expected)} expected losses given)")
    overall = logits_ok and loss_ok and grads_ok and steps_ok
    print(f"overall okay: {int(overall)}")
    return 0 if overall else 1


@one_line_warnings
def main(argv=None) -> int:
    from .sim.compiler import CompilerNotFound   # no g++ for the emulator: set-up, exit 2

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1 (got {args.steps}): step 0 checks the loss and gradients")
    try:
        return run_gate(args)
    except BrokenPipeError:
        raise   # stdout's reader went away (| head), not a bad file: run_main ends quietly with 141
    except (ops_registry.OpError, ModelError, FileFormatError, OSError, _backend.BackendError, CompilerNotFound) as exc:
        # FileFormatError (CheckpointError included): a bad model, debug-state or losses file
        from ._cli import fail

        return fail(exc)


if __name__ == "__main__":
    from llmcupy._cli import run_main

    sys.exit(run_main(main))
