"""python -m llmcupy.launchbench: the host (Python) cost of one op launch, kernels stubbed out.

Once kernels are fast, eager training is bound by the Python between launches: a GPT-2 124M step
makes a few hundred launches. This records the op calls of one training step (forward, backward,
AdamW) of a model with GPT-2 124M's layer count, then replays them with the kernel launch itself
stubbed (``runtime.module.STUBBED``: every check and all the Python run, the kernel does not), so
the figure needs no GPU and can be tracked on any machine:

* ``checked``: every call checked in full (validation, constraints, each kernel argument against
  its C signature) -- the launch path before launch plans;
* ``planned``: the default path, a launch plan per (op, version, shapes) replayed after the
  first call (see ``ops/_op.py``); for a ``@kernels_only`` version the plan replays the checked
  call's recorded kernel launches without running the launcher.

It prints microseconds per op call and per kernel launch for both, and the launches per step.
The replays pass the recorded argument dicts again, the same array objects each time, back to
back; the ``in-step`` figure times the kernel-only op calls inside whole training steps instead,
where the model makes its per-layer views (``acts["ln1"][l]``) afresh on every call, as the
trainer does, and the emulator's NumPy stand-ins for cuBLAS run between them (cold CPU caches: an
upper bound for a GPU, where those are asynchronous library calls).
The model is GPT-2 124M's depth (12 layers, the step's op sequence) at a narrow width and a tiny
batch, since the host cost of a launch does not depend on the sizes (NumPy stand-ins for cuBLAS
calls do, so they are kept small); ``--init d12`` uses the real widths.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def _model(init: str, B: int, T: int, kernels):
    from .config import GPT2Config, init_params
    from .model import GPT2

    if init == "narrow12":
        cfg = GPT2Config(max_seq_len=max(T, 64), vocab_size=256, num_layers=12, num_heads=4, channels=64)
    else:
        cfg = GPT2Config.preset(init)
    model = GPT2(cfg, init_params(cfg, seed=0), kernels)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, size=(B, T + 1))
    return model, tokens[:, :-1], tokens[:, 1:]


def record_step(model, x, y) -> list:
    """The op calls of one training step, as (op, args, kwargs, uses_library) to replay ``Op.run`` with.

    ``uses_library`` marks calls that compute through a library (``runtime.blas.gemm`` or
    ``xp.matmul``: cuBLAS on a GPU, NumPy arithmetic in the emulator), whose time is not launch
    overhead here.
    """
    from .ops._op import Op
    from .runtime import blas

    calls = []
    original = Op.run
    original_matmul = np.matmul
    original_gemm = blas.gemm
    current = []

    def recording(self, *args, **kwargs):
        current.append(len(calls))
        calls.append([self, args, kwargs, False])
        try:
            return original(self, *args, **kwargs)
        finally:
            current.pop()

    def library(fn):
        def counting(*args, **kwargs):
            if current:
                calls[current[-1]][3] = True
            return fn(*args, **kwargs)
        return counting

    Op.run = recording
    np.matmul = library(original_matmul)
    blas.gemm = library(original_gemm)   # the ops call it as blas.gemm: looked up at each call
    try:
        _step(model, x, y)
    finally:
        Op.run = original
        np.matmul = original_matmul
        blas.gemm = original_gemm
    return [tuple(c) for c in calls]


def _best_of(calls, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for op, args, kwargs, _lib in calls:
            op.run(*args, **kwargs)
        best = min(best, time.perf_counter() - t0)
    return best


def _in_step(model, x, y, calls, repeats: int) -> float:
    """Best over ``repeats`` whole steps of the mean time inside ``Op.run`` of the kernel-only calls
    (the i-th call of a step is the i-th recorded one: a step's op sequence is fixed)."""
    from .ops._op import Op

    original = Op.run
    spent = [0.0]
    index = [0]
    library = [c[3] for c in calls]
    clock = time.perf_counter

    def timed(self, *args, **kwargs):
        i = index[0]
        index[0] += 1
        t0 = clock()
        try:
            return original(self, *args, **kwargs)
        finally:
            if not library[i]:
                spent[0] += clock() - t0

    best = float("inf")
    Op.run = timed
    try:
        for _ in range(repeats):
            spent[0], index[0] = 0.0, 0
            _step(model, x, y)
            best = min(best, spent[0])
    finally:
        Op.run = original
    return best / max(1, library.count(False))


def _step(model, x, y) -> None:
    model.forward(x, y)
    model.zero_grad()
    model.backward()
    model.update(1e-4, 0.9, 0.999, 1e-8, 0.0, 1)


def default_kernels(fused: bool = False):
    """Hand-written kernels where the catalogue has them: in the emulator a cuBLAS call (xp.matmul)
    is real NumPy arithmetic, not a launch, and would be counted as launch overhead. The ops that
    only exist over cuBLAS (matmul_backward v1, attention v4/v8's GEMMs) keep it, on tiny matrices."""
    from .model import KernelChoice

    k = KernelChoice()
    k.set("matmul_forward", 5)
    if fused:
        k.select_fusions()
    return k


def measure(init: str = "narrow12", B: int = 1, T: int = 8, repeats: int = 20, kernels=None) -> dict:
    from .ops._op import clear_plans, launch_plans
    from .runtime.module import STUBBED, launch_count

    kernels = kernels if kernels is not None else default_kernels()
    model, x, y = _model(init, B, T, kernels)
    result = {"model": init, "B": B, "T": T, "layers": model.config.num_layers}
    # stubbed kernels leave garbage in the buffers, which the NumPy stand-ins then multiply
    with STUBBED, np.errstate(all="ignore"):
        _step(model, x, y)  # allocations, compilation of every kernel used
        calls = record_step(model, x, y)
        kernel_only = [c for c in calls if not c[3]]
        before = launch_count()
        for op, args, kwargs, _lib in kernel_only:
            op.run(*args, **kwargs)
        kernel_only_launches = launch_count() - before
        for op, args, kwargs, _lib in calls:
            if _lib:
                op.run(*args, **kwargs)
        launches = launch_count() - before
        result["op_calls_per_step"] = len(calls)
        result["launches_per_step"] = launches
        result["library_op_calls_per_step"] = len(calls) - len(kernel_only)
        for label, enabled in (("checked", False), ("planned", True)):
            clear_plans()
            with launch_plans(enabled):
                for op, args, kwargs, _lib in calls:  # first calls record the plans
                    op.run(*args, **kwargs)
                best = _best_of(calls, repeats)
                best_kernel_only = _best_of(kernel_only, repeats)
                in_step = _in_step(model, x, y, calls, max(3, repeats // 4))
                step_t0 = time.perf_counter()
                _step(model, x, y)
                step_s = time.perf_counter() - step_t0
            result[label] = {
                "us_per_op_call": best / len(calls) * 1e6,
                "us_per_launch": best / max(1, launches) * 1e6,
                "kernel_only_us_per_op_call": best_kernel_only / max(1, len(kernel_only)) * 1e6,
                "kernel_only_us_per_launch": best_kernel_only / max(1, kernel_only_launches) * 1e6,
                "in_step_kernel_only_us_per_op_call": in_step * 1e6,
                "step_host_ms": step_s * 1e3,
            }
    return result


def format_result(r: dict) -> str:
    lines = [f"launch path, kernels stubbed: {r['model']} ({r['layers']} layers), B={r['B']} T={r['T']}",
             f"  per training step: {r['op_calls_per_step']} op calls, {r['launches_per_step']} kernel launches "
             f"({r['library_op_calls_per_step']} op calls also compute through cuBLAS, runtime.blas)",
             f"  {'path':<8} {'us/op call':>11} {'us/launch':>10} {'kernel-only us/op call':>23} "
             f"{'us/launch':>10} {'in-step':>8} {'step host ms':>13}"]
    for label in ("checked", "planned"):
        m = r[label]
        lines.append(f"  {label:<8} {m['us_per_op_call']:>11.1f} {m['us_per_launch']:>10.1f} "
                     f"{m['kernel_only_us_per_op_call']:>23.1f} {m['kernel_only_us_per_launch']:>10.1f} "
                     f"{m['in_step_kernel_only_us_per_op_call']:>8.1f} {m['step_host_ms']:>13.1f}")
    c, p = r["checked"], r["planned"]
    lines.append(f"  Op.run speed-up: {c['us_per_op_call'] / p['us_per_op_call']:.1f}x over all calls, "
                 f"{c['kernel_only_us_per_op_call'] / p['kernel_only_us_per_op_call']:.1f}x over kernel-only calls")
    lines.append("  (best of the repeats. 'kernel-only' leaves out the calls that also compute through cuBLAS (runtime.blas),"
                 " which the emulator runs as NumPy arithmetic; 'in-step': kernel-only us/op call inside whole steps,"
                 " with the model's fresh per-layer views; step host ms includes the model's own Python)")
    return "\n".join(lines)


def main(argv=None) -> int:
    from . import _cli
    from .config import PRESETS
    from .runtime import backend as _backend

    inits = ("narrow12", *PRESETS)
    p = argparse.ArgumentParser(prog="python -m llmcupy.launchbench", description=__doc__.split("\n\n")[0])
    p.add_argument("--init", default="narrow12", choices=inits, metavar="SHAPE",
                   help=f"model shape: narrow12 (12 layers, C=64; default) or a preset: {', '.join(PRESETS)}")
    p.add_argument("-b", "--batch-size", type=_cli.int_at_least(1), default=1)
    p.add_argument("-t", "--seq-len", type=_cli.int_at_least(1), default=8)
    p.add_argument("--repeats", type=_cli.int_at_least(1), default=20,
                   help="replays of the step's calls; the best is reported")
    p.add_argument("--fused", action="store_true", help="the step with every fusion (as python -m llmcupy.train --fused)")
    p.add_argument("--json", help="also write the result to this file")
    p.add_argument("--backend", choices=_backend.CHOICES, default=None, help="cuda, sim or auto (default: auto)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    from .model import ModelError

    try:
        if args.json:
            _cli.check_output_file(args.json, "--json")   # before the measurement, not after it
        if args.backend:
            _backend.set_backend(args.backend)
        _backend.get_backend()  # cuda asked for (LLMCUPY_BACKEND) but unusable: one line, exit 2
        r = measure(args.init, args.batch_size, args.seq_len, args.repeats, kernels=default_kernels(args.fused))
    except (_backend.BackendError, _cli.BadPath, ModelError) as exc:
        return _cli.fail(exc)   # T past the model's context, out of memory: one line, exit 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    r["fused"] = bool(args.fused)
    print(format_result(r))
    if args.json:
        import platform
        import shlex

        from .bench import _software_versions, _utc_now, git_commit

        # host microseconds depend on the machine, the Python and the commit: the record says which
        r = {"schema": "llmcupy.launchbench/1", "date": _utc_now().isoformat().replace("+00:00", "Z"),
             "command": "python -m llmcupy.launchbench" + ("" if not argv else " " + shlex.join(argv)),
             "backend": _backend.get_backend(), "device": _backend.device_name(), "host": platform.node(),
             "git": git_commit(), "software": _software_versions(), **r}
        from .fileio import atomic_write

        with atomic_write(args.json) as f:
            f.write(json.dumps(r, indent=2).encode())
    return 0


if __name__ == "__main__":
    from llmcupy._cli import run_main

    sys.exit(run_main(main))
