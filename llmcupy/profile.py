"""python -m llmcupy.profile: one training step of the FP32 trainer with every op launch timed.

    python -m llmcupy.profile                                   # GPT-2 124M, B=4, T=1024 (llm.c's defaults)
    python -m llmcupy.profile --init d2 -b 2 -t 64              # a tiny model (what the emulator can run)
    python -m llmcupy.profile --init d12 -b 8 -t 1024 --steps 5 --json profile.json
    python -m llmcupy.profile --kernel attention_backward=7     # any train flag selects versions

Takes the trainer's flags (``python -m llmcupy.train``); runs ``--warmup`` untimed steps (default 1)
then ``--steps`` profiled steps (default 1) on one fixed batch, as ``--benchmark`` does. Every op
launch is observed through the ops' profiler hook (``llmcupy.ops.add_hook``):

* on a GPU, a CUDA event is recorded on the stream right before the op's first kernel (or cuBLAS
  call) is enqueued and after its last (``runtime.module.LAUNCH_OBSERVERS``), so the Python dispatch
  before the first launch is not charged to the op; the step ends with a synchronise, then the
  elapsed times are read. An op's time spans everything it launches, the cuBLAS
  GEMMs it calls included (matmul_forward/backward, attention). The table gives, per (op, version,
  phase): calls, ms, % of the step, achieved GB/s (memory-bound ops) or TFLOP/s (GEMM-shaped ops)
  from the op's ``bound`` evaluated on the actual arrays, and the fraction of the upper bound: the
  measured device-to-device copy bandwidth, or the cuBLAS TFLOP/s measured once on the model's MLP
  GEMM (B*T x C) @ (C x 4C). Then the split by phase, and the step's wall-clock ms and tokens/s;
  ``other (memsets, host)`` is the step time not inside an op (buffer zeroing, the loss read-back,
  Python), so the percentages add up to 100.
* in the CPU emulator there is no GPU time: the table gives calls, bytes and FLOPs per op and per
  phase, and the emulator's wall time per op, clearly labelled as such (percentages then refer to
  emulator time, which says nothing about a GPU).

``--json PATH`` writes all of it, with what a record needs to be compared later: ``schema``
(``llmcupy.profile/1``), ``date`` (UTC), ``command`` (the exact command line), ``git`` (``commit``,
``dirty``), ``device`` and ``software`` (Python, NumPy, CuPy, CUDA runtime and driver).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

import numpy as np

from . import ops as ops_registry
from .model import GPT2, ModelError
from .runtime import backend as _backend
from .runtime import blas
from .runtime.module import LAUNCH_OBSERVERS
from .runtime.module import launch_count
from .train import build_parser as build_train_parser
from .fileio import FileFormatError
from .train import batch_shape, check_loss, kernel_choice, load_model
from ._cli import one_line_warnings

PHASES = ("encoder", "forward blocks", "classifier", "backward blocks", "optimizer")
OTHER = "other (memsets, host)"
GPU_NOTE = ("GPU times from CUDA events recorded around each op launch; an op's time includes the cuBLAS "
            "GEMMs it calls (and, when the host is slower than the GPU, launch gaps between its kernels)")
SIM_NOTE = ("CPU EMULATOR: the times below are the emulator's wall time on this CPU, NOT GPU times; the "
            "percentages refer to emulator time and say nothing about a GPU (GEMMs cuBLAS runs on a GPU are NumPy "
            "matmuls here). Calls, bytes and FLOPs are exact.")


def build_parser() -> argparse.ArgumentParser:
    """The trainer's parser (every flag of ``python -m llmcupy.train``), plus --json and --random-data."""
    p = build_train_parser()
    p.prog = "python -m llmcupy.profile"
    p.description = __doc__.split("\n\n")[0]
    p.epilog = "All other flags are python -m llmcupy.train's; --benchmark is implied (one fixed batch)."
    for action in p._actions:  # the trainer's defaults for these describe training, not profiling
        if action.dest == "steps":
            action.default, action.help = 1, "profiled steps (default 1); the table reports the mean per step"
        elif action.dest == "warmup":
            action.default, action.help = 1, "untimed warm-up steps first (default 1)"
        elif action.dest == "benchmark":   # the trainer's help promised its 10 timed steps
            action.help = "implied: the profile always runs one fixed batch"
    g = p.add_argument_group("profile")
    g.add_argument("--json", default=None, metavar="PATH", help="write the whole profile as JSON")
    g.add_argument("--random-data", action="store_true",
                   help="a random batch (seeded by --seed) instead of the first batch of -i")
    return p


# -- recording ----------------------------------------------------------------------------------


class Recorder:
    """The profiler hook: one record per outermost op launch (a launch inside another op's is the outer op's)."""

    def __init__(self, gpu: bool):
        self.gpu = gpu
        self.records: list[dict] = []
        self.depth = 0
        self.current = None  # the outermost op's record while it launches (GPU)

    def __call__(self, op, version, block_size, arrays):
        if self.depth:
            return contextlib.nullcontext()
        return self._launch(op, version, block_size, arrays)

    @contextlib.contextmanager
    def _launch(self, op, version, block_size, arrays):
        rec = {"op": op.name, "version": int(version), "block_size": int(block_size),
               "phase": ops_registry.current_phase() or "(none)", **_work(op, arrays)}
        self.depth += 1
        try:
            if self.gpu:
                import cupy

                # Events around the op's launches only: the start event is recorded just before its
                # first kernel or cuBLAS call is enqueued, the end event after its last (see
                # before/after), so the Python dispatch before the first launch is not the op's.
                # An op that launched nothing through llmcupy (CuPy calls only) is timed whole.
                outer = cupy.cuda.Event()
                outer.record()
                self.current = rec
                try:
                    yield
                finally:
                    self.current = None
                if "first" not in rec:
                    rec["last"] = cupy.cuda.Event()
                    rec["last"].record()
                rec["events"] = (rec.pop("first", outer), rec.pop("last"))
            else:
                t0 = time.perf_counter()
                yield
                rec["ms"] = (time.perf_counter() - t0) * 1e3
        finally:
            self.depth -= 1
        self.records.append(rec)

    def before(self) -> None:
        """A launch observer (runtime.module.LAUNCH_OBSERVERS): the op's first launch starts its window."""
        rec = self.current
        if rec is not None and "first" not in rec:
            import cupy

            rec["first"] = cupy.cuda.Event()
            rec["first"].record()

    def after(self) -> None:
        rec = self.current
        if rec is not None:
            import cupy

            if "last" not in rec:
                rec["last"] = cupy.cuda.Event()
            rec["last"].record()  # re-recorded after each launch: the window ends after the last

    def resolve(self) -> None:
        """After a synchronise: the elapsed time of every GPU record."""
        if not self.gpu:
            return
        import cupy

        for rec in self.records:
            if "events" in rec:
                start, end = rec.pop("events")
                rec["ms"] = float(cupy.cuda.get_elapsed_time(start, end))


def _work(op, arrays) -> dict:
    """The bytes (memory-bound) or FLOPs (GEMM-shaped) of one launch, from the op's bound on these arrays."""
    b = op.bound
    if b is None or op.sizes_of is None:
        return {"kind": None, "bytes": None, "flops": None}
    try:
        sizes = op.sizes_of(arrays)
        if b.kind == "memory":
            return {"kind": "memory", "bytes": int(b.bytes(sizes)), "flops": None}
        return {"kind": "flops", "bytes": None, "flops": int(b.flops(sizes))}
    except Exception as exc:  # a bound that cannot be evaluated must not stop the profile
        return {"kind": b.kind, "bytes": None, "flops": None, "bound_error": f"{type(exc).__name__}: {exc}"}


# -- upper bounds (GPU only) ----------------------------------------------------------------------


def cublas_tflops(B: int, T: int, C: int) -> dict:
    """cuBLAS SGEMM throughput on the model's MLP GEMM, (B*T x C) @ (C x 4C), as matmul_forward calls it."""
    import cupy

    from .runtime import timing

    BT, OC = B * T, 4 * C
    rng = np.random.default_rng(0)
    a = cupy.asarray(rng.uniform(-1, 1, (BT, C)).astype(np.float32))
    w = cupy.asarray(rng.uniform(-1, 1, (OC, C)).astype(np.float32))
    out = cupy.empty((BT, OC), dtype=cupy.float32)
    t = timing.benchmark_ms(lambda: blas.gemm(a, w, out, trans_b=True), repeat=20, warmup=3)["min_ms"]
    flops = 2 * BT * C * OC
    return {"gemm": f"({BT} x {C}) @ ({C} x {OC})", "ms": t, "flops": flops, "tflops": flops / (t * 1e-3) / 1e12}


# -- aggregation ----------------------------------------------------------------------------------


def summarize(records: list[dict], steps: int, step_ms: float, bounds: dict, gpu: bool) -> dict:
    """Per (op, version, block size, phase) rows and per-phase totals, all per step."""
    rows: dict[tuple, dict] = {}
    for r in records:
        key = (r["op"], r["version"], r["block_size"], r["phase"])
        row = rows.setdefault(key, {"op": r["op"], "version": r["version"], "block_size": r["block_size"],
                                    "phase": r["phase"], "kind": r["kind"], "calls": 0, "ms": 0.0,
                                    "bytes": 0 if r["kind"] == "memory" else None,
                                    "flops": 0 if r["kind"] == "flops" else None})
        row["calls"] += 1
        row["ms"] += r.get("ms", 0.0)
        for k in ("bytes", "flops"):
            if row[k] is not None:
                row[k] = None if r[k] is None else row[k] + r[k]
        if "bound_error" in r:
            row["bound_error"] = r["bound_error"]
    out_rows = []
    for row in rows.values():
        row["ms"] /= steps
        for k in ("calls", "bytes", "flops"):
            if row[k] is not None:
                row[k] = row[k] / steps if row[k] % steps else row[k] // steps  # exact when whole
        row["pct"] = 100.0 * row["ms"] / step_ms if step_ms > 0 else 0.0
        if gpu and row["ms"] > 0:
            s = row["ms"] * 1e-3
            if row["bytes"] is not None:
                row["gbs"] = row["bytes"] / s / 1e9
                if bounds.get("copy_gbs"):
                    row["fraction_of_bound"] = row["gbs"] / bounds["copy_gbs"]
            elif row["flops"] is not None:
                row["tflops"] = row["flops"] / s / 1e12
                if bounds.get("cublas", {}).get("tflops"):
                    row["fraction_of_bound"] = row["tflops"] / bounds["cublas"]["tflops"]
        out_rows.append(row)
    out_rows.sort(key=lambda r: (-r["ms"], -(r["bytes"] or 0) - (r["flops"] or 0), r["op"]))

    kernel_ms = sum(r["ms"] for r in out_rows)
    order = list(PHASES) + sorted({r["phase"] for r in out_rows} - set(PHASES))
    phases = []
    for name in order:
        mine = [r for r in out_rows if r["phase"] == name]
        if not mine:
            continue
        ms = sum(r["ms"] for r in mine)
        phases.append({"phase": name, "ms": ms, "pct": 100.0 * ms / step_ms if step_ms > 0 else 0.0,
                       "calls": sum(r["calls"] for r in mine),
                       "bytes": _total(r["bytes"] for r in mine), "flops": _total(r["flops"] for r in mine)})
    other = max(step_ms - kernel_ms, 0.0)
    phases.append({"phase": OTHER, "ms": other, "pct": 100.0 * other / step_ms if step_ms > 0 else 0.0,
                   "calls": 0, "bytes": None, "flops": None})

    by_op: dict[str, dict] = {}
    for r in out_rows:
        o = by_op.setdefault(r["op"], {"op": r["op"], "calls": 0, "ms": 0.0})
        o["calls"] += r["calls"]
        o["ms"] += r["ms"]
    by_op_list = sorted(by_op.values(), key=lambda o: -o["ms"])
    for o in by_op_list:
        o["pct"] = 100.0 * o["ms"] / step_ms if step_ms > 0 else 0.0
    return {"ops": out_rows, "phases": phases, "by_op": by_op_list, "kernel_ms": kernel_ms, "other_ms": other,
            "other_pct": 100.0 * other / step_ms if step_ms > 0 else 0.0}


def _total(values):
    """The sum of the values that are known; None when none is."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


# -- printing -------------------------------------------------------------------------------------


def _si(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {prefix}{unit}"
    return f"{x:.0f} {unit}"


def print_report(report: dict) -> None:
    gpu = report["timing"] == "gpu-events"
    s = report["summary"]
    step_ms = report["step_ms"]
    print()
    print(GPU_NOTE if gpu else SIM_NOTE)
    if gpu:
        b = report["bounds"]
        print(f"upper bounds: copy bandwidth {b['copy_gbs']:.0f} GB/s (memory-bound ops); cuBLAS "
              f"{b['cublas']['tflops']:.2f} TFLOP/s on {b['cublas']['gemm']} (GEMM-shaped ops), "
              f"TF32 {'on' if report['tf32'] else 'off'}")
    print(f"per step, mean of {report['steps']} profiled step(s) after {report['warmup']} warm-up:")
    print()
    tcol = "ms" if gpu else "emu ms"
    if gpu:
        head = f"{'op':<20} {'v':>3} {'phase':<15} {'calls':>6} {tcol:>10} {'% step':>7} {'achieved':>15} {'% bound':>8}"
    else:
        head = f"{'op':<20} {'v':>3} {'phase':<15} {'calls':>6} {tcol:>10} {'% emu':>7} {'bytes':>11} {'FLOPs':>12}"
    print(head)
    print("-" * len(head))
    for r in s["ops"]:
        line = f"{r['op']:<20} {r['version']:>3} {r['phase']:<15} {r['calls']:>6} {r['ms']:>10.3f} {r['pct']:>6.1f}%"
        if gpu:
            if "gbs" in r:
                ach = f"{r['gbs']:.1f} GB/s"
            elif "tflops" in r:
                ach = f"{r['tflops']:.2f} TFLOP/s"
            else:
                ach = "-"
            frac = f"{100 * r['fraction_of_bound']:.0f}%" if "fraction_of_bound" in r else "-"
            line += f" {ach:>15} {frac:>8}"
        else:
            line += f" {_si(r['bytes'], 'B'):>11} {_si(r['flops'], 'FLOP'):>12}"
        print(line)
    print("-" * len(head))
    print(f"{'all ops':<20} {'':>3} {'':<15} {sum(r['calls'] for r in s['ops']):>6} {s['kernel_ms']:>10.3f} "
          f"{100 * s['kernel_ms'] / step_ms if step_ms else 0:>6.1f}%")
    print(f"{OTHER:<41} {s['other_ms']:>10.3f} {s['other_pct']:>6.1f}%")
    total_pct = sum(r["pct"] for r in s["ops"]) + s["other_pct"]
    print(f"{'step':<41} {step_ms:>10.3f} {total_pct:>6.1f}%")
    print()
    print("by phase:" + ("" if gpu else " (emulator time; bytes and FLOPs exact)"))
    for ph in s["phases"]:
        line = f"  {ph['phase']:<22} {ph['ms']:>10.3f} ms {ph['pct']:>6.1f}%"
        if ph["phase"] != OTHER:
            line += f"   {ph['calls']:>5} calls"
            if not gpu:
                line += f"  {_si(ph['bytes'], 'B'):>11}  {_si(ph['flops'], 'FLOP'):>12}"
        print(line)
    print()
    print("by op:")
    for o in s["by_op"]:
        print(f"  {o['op']:<22} {o['ms']:>10.3f} ms {o['pct']:>6.1f}%   {o['calls']:>5} calls")
    print()
    if report.get("launches_per_step") is not None:
        print(f"launches per step: {report['launches_per_step']} kernel launches from {report['op_calls_per_step']} "
              "op calls (catalogue kernels; cuBLAS GEMMs, llmcupy.runtime.blas, not counted)")
    what = "GPU step" if gpu else "emulator step (CPU time, not a GPU's)"
    print(f"{what}: {step_ms:.3f} ms, {report['tokens_per_s']:.0f} tok/s (B={report['B']}, T={report['T']}; "
          f"wall clock, synchronised)")
    if report.get("cuda_graph_step_ms") is not None:
        ms = report["cuda_graph_step_ms"]
        where = "" if report["backend"] == "cuda" else " (emulator: no graphs, the replay runs eagerly; CPU time)"
        print(f"same step with the CUDA graph: {ms:.3f} ms ({report['B'] * report['T'] / (ms * 1e-3):.0f} tok/s){where}")
    if report.get("unprofiled_step_ms") is not None:
        print(f"same step without the profiler's events: {report['unprofiled_step_ms']:.3f} ms "
              f"({report['B'] * report['T'] / (report['unprofiled_step_ms'] * 1e-3):.0f} tok/s)")
    for note in report.get("notes", []):
        print(f"note: {note}")


# -- the run --------------------------------------------------------------------------------------


def _batch(args, cfg, B: int, T: int):
    if args.random_data:
        rng = np.random.default_rng(args.seed)
        tokens = rng.integers(0, cfg.vocab_size, size=(B, T + 1), dtype=np.int64).astype(np.int32)
        return tokens[:, :-1], tokens[:, 1:], "random tokens"
    from .data import DataLoader

    try:
        # every file is scanned for ids outside the vocabulary, as the trainer does: the error names
        # the file and offset before the model is allocated (the model's own check sees one batch)
        loader = DataLoader(args.train_data, B, T, shuffle=True, vocab_size=cfg.vocab_size)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{exc}; prepare the data (python -m llmcupy.data tinyshakespeare) and give its "
                                "train file with -i, or profile on --random-data") from None
    x, y = loader.next_batch()
    return x, y, f"first train batch of {args.train_data}"


SCHEMA = "llmcupy.profile/1"


def profile(args) -> dict:
    """The profile run; TF32 (``--tf32``) is on for this run only."""
    with contextlib.ExitStack() as scope:
        return _profile(args, scope)


def _profile(args, scope: contextlib.ExitStack) -> dict:
    if args.backend:
        _backend.set_backend(args.backend)
    B, T = batch_shape(args)
    if B < 1 or T < 1:
        raise SystemExit(f"error: -b and -t must be positive (got {B}, {T})")
    if args.steps < 1 or args.warmup < 0:
        raise SystemExit(f"error: --steps must be >= 1 and --warmup >= 0 (got {args.steps}, {args.warmup})")
    for flag, value in (("--resume", args.resume), ("--save-every", args.save_every or None),
                        ("--save-path", args.save_path), ("-o", args.log)):
        if value is not None:   # parsed as the trainer's flags, but a profile neither resumes nor writes them
            instead = " (-e takes a training state: -e STATE profiles its model)" if flag == "--resume" else ""
            raise SystemExit(f"error: {flag} is the trainer's; the profile does not use it{instead}")
    if args.seed < 0:   # NumPy's seeding would stop with a traceback
        raise SystemExit(f"error: --seed must be >= 0 (got {args.seed})")
    kernels = kernel_choice(args)
    cfg, params, source = load_model(args)
    if T > cfg.max_seq_len:
        raise SystemExit(f"error: -t {T} is larger than the model's context (max_seq_len = {cfg.max_seq_len})")
    tf32 = scope.enter_context(blas.tf32(bool(args.tf32)))
    gpu = _backend.get_backend() == "cuda"
    x, y, data = _batch(args, cfg, B, T)

    model = GPT2(cfg, params, kernels)
    model.allocate(B, T)
    print(f"profiling {source}: L={cfg.num_layers} C={cfg.channels} NH={cfg.num_heads} Vp={cfg.padded_vocab_size}, "
          f"B={B} T={T}, {data}; backend {_backend.get_backend()} ({_backend.device_name()})")
    print("kernel versions: " + ", ".join(f"{op} {n}" for op, n, _ in kernels.table()))
    notes = []
    if getattr(args, "cuda_graph", False):
        notes.append("--cuda-graph: a graph replay cannot be observed op by op, so the profiled steps launch "
                     "every op eagerly; the step with the graph is timed separately (the 'with the CUDA graph' line)")

    t = [0]

    def step() -> float:
        t[0] += 1
        loss = model.train_step(x, y, args.lr, 0.9, 0.999, 1e-8, args.weight_decay, t[0])  # one read, at the end
        check_loss(loss, t[0], "train")
        return loss

    for _ in range(args.warmup):
        step()
    _backend.synchronize()

    bounds = {}
    if gpu:
        from .runtime import timing

        bounds = {"copy_gbs": timing.copy_bandwidth_gbs(), "cublas": cublas_tflops(B, T, cfg.channels)}

    recorder = Recorder(gpu)
    step_times, losses = [], []
    launches_before = launch_count()
    ops_registry.add_hook(recorder)
    LAUNCH_OBSERVERS.append(recorder)
    try:
        for _ in range(args.steps):
            _backend.synchronize()
            t0 = time.perf_counter()
            losses.append(step())
            _backend.synchronize()
            step_times.append((time.perf_counter() - t0) * 1e3)
            recorder.resolve()
    finally:
        ops_registry.remove_hook(recorder)
        LAUNCH_OBSERVERS.remove(recorder)
    launches_per_step = (launch_count() - launches_before) // args.steps

    unprofiled = None
    if gpu:  # the profiler's events cost a little host time: the same steps without them, for reference
        times = []
        for _ in range(args.steps):
            _backend.synchronize()
            t0 = time.perf_counter()
            step()
            _backend.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        unprofiled = float(np.mean(times))

    graph_ms = None
    if getattr(args, "cuda_graph", False):  # the same step captured once and replayed
        from .train import graph_step

        t[0] += 1
        loss, graph = graph_step(model, None, x, y, args, t[0])  # this call captures (after a warm-up step)
        check_loss(loss, t[0], "train")
        times = []
        for _ in range(args.steps):
            t[0] += 1
            _backend.synchronize()
            t0 = time.perf_counter()
            loss, graph = graph_step(model, graph, x, y, args, t[0])
            _backend.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
            check_loss(loss, t[0], "train")
        graph_ms = float(np.mean(times))

    from .bench import _software_versions, _utc_now, git_commit

    step_ms = float(np.mean(step_times))
    summary = summarize(recorder.records, args.steps, step_ms, bounds, gpu)
    missing = sorted({r["op"] for r in recorder.records if r["kind"] is None})
    if missing:
        notes.append(f"no bound for {', '.join(missing)} (no bytes/FLOPs)")
    failed = sorted({r["op"] for r in recorder.records if "bound_error" in r})
    if failed:
        notes.append(f"bound could not be evaluated for {', '.join(failed)}")
    report = {
        "schema": SCHEMA, "date": _utc_now().isoformat().replace("+00:00", "Z"),
        "command": getattr(args, "command", None) or "python -m llmcupy.profile", "git": git_commit(),
        "software": _software_versions(),
        "timing": "gpu-events" if gpu else "cpu-emulator-wall",
        "note": GPU_NOTE if gpu else SIM_NOTE,
        "backend": _backend.get_backend(), "device": _backend.device_name(), "tf32": bool(tf32),
        "model": source, "config": {"num_layers": cfg.num_layers, "num_heads": cfg.num_heads,
                                    "channels": cfg.channels, "vocab_size": cfg.vocab_size,
                                    "padded_vocab_size": cfg.padded_vocab_size, "max_seq_len": cfg.max_seq_len},
        "B": B, "T": T, "data": data, "steps": args.steps, "warmup": args.warmup,
        "kernels": {op: n for op, n, _ in kernels.table()},
        "losses": [float(v) for v in losses],
        "step_ms": step_ms, "step_ms_each": step_times, "tokens_per_s": B * T / (step_ms * 1e-3),
        "launches_per_step": launches_per_step,
        "op_calls_per_step": int(round(sum(r["calls"] for r in summary["ops"]))),
        "unprofiled_step_ms": unprofiled,
        "cuda_graph_step_ms": graph_ms,
        "bounds": bounds, "summary": summary, "notes": notes,
    }
    if gpu:
        from .runtime import timing

        report["versions"] = timing.cuda_versions()
    return report


@one_line_warnings
def main(argv=None) -> int:
    from .sim.compiler import CompilerNotFound   # no g++ for the emulator: set-up, exit 2

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    import shlex

    args.command = "python -m llmcupy.profile" + ("" if not argv else " " + shlex.join(argv))   # for the record
    if args.json:   # checked before the run: a path it cannot write was a traceback after the whole profile
        from ._cli import BadPath, check_output_file, fail

        try:
            check_output_file(args.json, "--json")   # as the other CLIs: atomic_write's rules (/dev/null)
        except BadPath as exc:
            return fail(exc)
    try:
        report = profile(args)
    except BrokenPipeError:
        raise   # stdout's reader went away (| head), not a bad file: run_main ends quietly with 141
    except (ops_registry.OpError, ModelError, FileFormatError, OSError, _backend.BackendError, CompilerNotFound) as exc:
        from ._cli import fail

        return fail(exc)   # bad or missing model/data files, a shape a version refuses: 2
    except SystemExit as exc:
        if isinstance(exc.code, str):   # an "error: ..." about the arguments or a missing model: 2
            print(exc.code, file=sys.stderr)
            return 2
        raise
    except FloatingPointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    print_report(report)
    if args.json:
        from .fileio import atomic_write

        with atomic_write(args.json) as f:   # a reader never sees half a profile
            f.write((json.dumps(report, indent=1) + "\n").encode())
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    from llmcupy._cli import run_main

    sys.exit(run_main(main))
