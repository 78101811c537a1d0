"""python -m llmcupy.bench: the whole catalogue (or some ops) swept, recorded as JSON, plotted, compared.

    python -m llmcupy.bench                                  # every version of every op, every block size
    python -m llmcupy.bench --ops softmax_forward layernorm_forward --plot sweep.png
    python -m llmcupy.bench --from bench/results/X.json --plot X.png   # plot a recorded run, run nothing
    python -m llmcupy.bench compare BEFORE.json AFTER.json   # per op/version: ms before, after, speed-up (or counts)
    python -m llmcupy.bench --list-results                   # the runs recorded under bench/results/ (and sim/)
    python -m llmcupy.bench --trainer-shapes                 # (GPU) the step's ops at GPT-2 124M, B=4, T=1024
    python -m llmcupy.bench defaults                         # bench/defaults.json: the trainer's measured defaults

Each run validates every available version of each op against its NumPy reference at every block size
of the version's sweep, at the spec's benchmark sizes (``op.sizes``). On a GPU each block size is also
timed (``runtime.timing``: events around one launch queued behind a spin kernel, L2 flushed) and
related to the op's upper bound: the measured device copy bandwidth for memory-bound ops, cuBLAS on
the same shapes for GEMM-shaped ones. In the emulator the ops run at their small ``op.sim_sizes``
and nothing is timed: the emulator does not model GPU time, so the record says so and holds
correctness only.

One JSON file per run goes to this checkout's ``bench/results/`` on a GPU, its ``bench/results/sim/``
(git-ignored: they are no GPU evidence) in the emulator, whatever the working folder, or to ``--out DIR``, named
``<UTC date>_<device>_<commit>.json``, saved after every version (``"partial": true`` until the run
ends, so a run stopped early keeps what it measured). Top level: ``schema``, ``date`` (UTC), ``command`` (the exact
command line), ``backend``, ``device``, ``software`` (Python, NumPy, CuPy, CUDA runtime and driver),
``git`` (``commit``, or "unknown", and ``dirty``), ``timed`` (and ``no_timings``, the reason, in the
emulator), ``ops`` (per op: its summary, default, bound, tolerances, ``source``, a digest of its kernel
file and the project headers it includes, and ``launcher``, one of its Python module: they tell two
runs of an edited, uncommitted kernel or launcher apart) and ``results``: one entry per op and version with ``ok`` (None: skipped, with
``skipped``; ``error`` when it crashed), ``sizes``, ``bound``, ``best`` (the fastest passing block size)
and ``blocks``, one per block size: ``ok``, ``errors`` (per output: max abs / rel error, mismatches),
``ms`` (mean; ``min_ms``, ``max_ms``), ``gbs`` or ``tflops`` and ``fraction_of_bound``. Emulator runs
also record ``metrics`` per version (``--no-analyze`` skips them): memory-traffic counts at one block
size, per launch and per source line, occupancy and the roofline model's time on ``--gpu``
(``llmcupy.analyze``; ``summary`` holds the op-level figures: ``sectors_per_request``,
``bytes_moved``, ``unique_bytes``, ``ideal_bytes``, ``conflict_ways``, ``model_seconds``, ...).

``compare`` reads two such files (or ``python -m llmcupy.kernel --json`` lists): the before/after
record of an optimisation, per op and version the best time before and after, the speed-up and any
change of verdict (between runs that hold no time, as the emulator's, the verdicts alone, under a line
saying why). For the versions whose ``metrics`` both runs hold (emulator runs) it also sets the
counts side by side (requests, sectors per request, bytes moved and unique bytes over the ideal,
shared requests, bank ways, occupancy: ``before -> after`` where they differ) with the model's time
and the ratio of the model's times, which it gives only at the same sizes and on the same model GPU.
It names the ops whose kernel files or launchers differ between the two runs (or says they are the same).
It exits 1 when a version that passed before fails after (a correctness regression), else 0; it
refuses (exit 2) to compare an emulator record with a GPU one.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import glob
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

from ._cli import int_at_least

SCHEMA = "llmcupy.bench/1"
NO_TIMING_REASON = ("the emulator runs kernels on the CPU and does not model GPU time, so this run validated "
                    "correctness only (at the ops' small sim_sizes) and recorded no timings")
EMULATOR_TITLE = "emulator: correctness only, no GPU timings"


def results_folder(backend: str = "cuda") -> Path:
    """Where a run is recorded without ``--out``: this checkout's ``bench/results`` (the folder ``bench
    defaults`` reads), whatever the working folder. Emulator runs are correctness records, not GPU
    measurements: they go to its git-ignored ``sim/``, so they are never mistaken for, or committed as,
    GPU evidence."""
    from .defaults import results_dir

    return results_dir() if backend == "cuda" else results_dir() / "sim"


def shown_path(path) -> str:
    """A default folder (or a file in it) as the output names it: relative to the working folder when
    inside it, else in full, so a command run from elsewhere says where it wrote or looked."""
    full = Path(path).resolve()
    try:
        return str(full.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(full)


# ----------------------------------------------------------------------------------------------
# provenance


def git_commit(repo: str | os.PathLike | None = None) -> dict:
    """``{"commit": sha or "unknown", "dirty": bool or None}`` of the checkout this package runs from."""
    repo = Path(repo) if repo is not None else Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        if sha.returncode != 0 or not sha.stdout.strip():
            return {"commit": "unknown", "dirty": None}
        status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=30)
        dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
        return {"commit": sha.stdout.strip(), "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "dirty": None}


def kernel_source_digest(source: str) -> str:
    """A digest of kernel file ``source`` (``softmax_forward.cu``) and the project headers it includes,
    by name and content: two runs of one commit with a kernel edited in between (a "dirty" checkout)
    differ here. Headers outside ``kernels_cu/`` (CUDA's own) are not in it."""
    import hashlib

    from .runtime.module import kernels_dir

    root, seen, pending = kernels_dir(), [], [source]
    while pending:
        name = pending.pop()
        if name in seen or not (root / name).is_file():
            continue
        seen.append(name)
        pending += re.findall(r'^\s*#\s*include\s+"([^"]+)"', (root / name).read_text(), re.M)
    digest = hashlib.sha256()
    for name in sorted(seen):
        digest.update(name.encode() + b"\0" + (root / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def launcher_digest(op_name: str) -> str:
    """A digest of op ``op_name``'s Python module (``llmcupy/ops/<op>.py``: its launchers' grids, block
    sizes and kernel choices), which changes a version's time as much as its kernel file can."""
    import hashlib
    import importlib

    path = Path(importlib.import_module(f"{__package__}.ops.{op_name}").__file__)
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _utc_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)


def _software_versions() -> dict:
    from .runtime import timing

    import numpy as np

    out = {"python": platform.python_version(), "numpy": np.__version__}
    try:
        from importlib.metadata import version

        out["llmcupy"] = version("llmcupy")
    except Exception:  # not installed, only on the path
        out["llmcupy"] = "unknown"
    out.update(timing.cuda_versions())  # cuda_runtime, cuda_driver, cupy (empty in the emulator)
    if "cupy" not in out:
        try:
            import cupy

            out["cupy"] = cupy.__version__
        except Exception:  # not installed, or its CUDA libraries fail to load
            pass
    return out


def _slug(text: str) -> str:
    text = re.sub(r"^NVIDIA\s+", "", text)
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:32] or "device"


# ----------------------------------------------------------------------------------------------
# running


def plan_for(op_names=None) -> list[tuple[str, int]]:
    """Every (op, version) pair of the given ops (default: the whole catalogue), in catalogue order."""
    from . import ops as registry

    if isinstance(op_names, str):
        op_names = [op_names]
    names = registry.names() if not op_names else list(dict.fromkeys(op_names))
    plan = []
    for name in names:
        op = registry.get(name)  # unknown op: OpError naming the choices
        plan += [(op.name, n) for n in sorted(op.versions)]
    return plan


def _sweep_one(op_name: str, number: int, small: bool, seed: int, repeat: int, trainer: bool = False) -> dict:
    from . import harness
    from . import ops as registry
    from .runtime import backend as _backend

    op = registry.get(op_name)
    if trainer:
        from .defaults import trainer_sizes

        sizes = dict(trainer_sizes()[op_name])
    else:
        sizes = dict(op.sim_sizes) if (small or _backend.is_sim()) else dict(op.sizes)
    return harness.sweep(op, number, sizes, None, seed, repeat=repeat)


def _sweep_and_analyze(op_name: str, number: int, small: bool, seed: int, repeat: int, analyze: bool,
                       gpu: str | None, trainer: bool = False, *, tf32: bool = False) -> dict:
    """``_sweep_one`` with TF32 set as ``tf32`` asks (here, in the child that runs the version: the setting
    is per process), then (``analyze``) the version's metrics and model at the same sizes. ``raw["tf32"]``
    says whether TF32 was in effect (never in the emulator or before sm_80, whatever was asked)."""
    from .runtime import blas

    with blas.tf32(tf32) as in_effect:
        raw = _sweep_one(op_name, number, small, seed, repeat, trainer)
    raw["tf32"] = in_effect
    if analyze and raw.get("ok") is not None:
        from . import analyze as _analyze
        from . import ops as registry

        raw["analysis"] = _analyze.analyze_version(registry.get(op_name), number, raw.get("sizes"), None, seed, gpu)
    return raw


def _tolerance_record(tolerance):
    """[atol, rtol], or a growing tolerance's formula (each check records the atol it was held to)."""
    return list(tolerance) if isinstance(tolerance, tuple) else str(tolerance)


def _block_entry(b: dict) -> dict:
    """A harness block entry in the record's vocabulary (ok, errors, ms, gbs/tflops, fraction_of_bound)."""
    out = {"block_size": b.get("block_size"), "ok": b.get("ok")}
    if b.get("skipped"):
        out["skipped"] = b["skipped"]
    if b.get("tolerance"):
        out["tolerance"] = b["tolerance"]   # "tf32": held to the op's TF32 tolerance
    if "checks" in b:
        out["errors"] = {c["name"]: {k: c.get(k) for k in ("max_abs", "max_rel", "mismatches", "atol", "rtol", "first")
                                     if c.get(k) is not None} for c in b["checks"]}
    if "mean_ms" in b:
        out.update(ms=b["mean_ms"], min_ms=b.get("min_ms"), max_ms=b.get("max_ms"), repeat=b.get("repeat"))
    for k in ("gbs", "tflops", "fraction_of_bound"):
        if k in b:
            out[k] = b[k]
    return out


def _version_entry(op_name: str, number: int, raw: dict) -> dict:
    from . import ops as registry

    op = registry.get(op_name)
    raw = {**raw, "op": op_name, "version": number, "summary": op.versions[number].summary}
    return _version_entry_from_raw(raw, default=number == op.default_version)


def run(op_names=None, *, small: bool = False, seed: int = 0, repeat: int = 50, isolate: bool | None = None,
        command: str | None = None, progress: bool = True, verbose: bool = False, log=None,
        trainer: bool = False, analyze: bool | None = None, gpu: str | None = None, on_entry=None,
        tf32: bool | None = None) -> dict:
    """Sweeps every version of the given ops and returns the run's record (see the module docstring).

    ``isolate`` (default: yes) runs the versions in child processes so that a kernel which crashes the
    emulator, or faults and poisons the CUDA context, fails only its own entry: a forked child per
    version in the emulator, on a GPU one spawned child until a version fails
    (``harness.SpawnedRunner``). ``on_entry(record)`` is called after every version (the CLI saves the
    record so far). ``log`` (default stdout) gets one line per version.
    The emulator's watchdog time limit is off during a benchmark. ``trainer`` runs the training
    step's ops at the trainer's shapes (``defaults.trainer_sizes``), the runs ``defaults`` reads.
    ``analyze`` (default: in the emulator) adds each version's memory-traffic metrics and roofline
    model on ``gpu`` (``llmcupy.analyze``) to its entry as ``metrics``. ``tf32`` (default: the trainer's
    setting, ``defaults.TRAINER_TF32``, for ``trainer`` runs, else off) sets TF32 for cuBLAS's FP32 GEMMs in
    the process that runs each version; the record's ``tf32`` is that request, each entry's ``tf32``
    whether it took effect (sm_80+ GPUs only), and a version that called cuBLAS under TF32 is validated
    against its op's ``tf32_tolerance``.
    """
    from .sim import settings as sim_settings

    if command is None:   # called from Python (a notebook): the record names the call, not a CLI never typed
        given = [repr([op_names] if isinstance(op_names, str) else list(op_names))] if op_names else []
        given += [f"{k}=True" for k, v in (("small", small), ("trainer", trainer)) if v]
        command = f"llmcupy.bench.run({', '.join(given)})"
    with sim_settings(timeout=0):
        return _run(op_names, small=small, seed=seed, repeat=repeat, isolate=isolate, command=command,
                    progress=progress, verbose=verbose, log=log, trainer=trainer, analyze=analyze, gpu=gpu,
                    on_entry=on_entry, tf32=tf32)


def default_tf32(trainer: bool) -> bool:
    """TF32 as the trainer runs its GEMMs for a --trainer-shapes run (the defaults are picked from it),
    plain FP32 otherwise (the ops' FP32 tolerances)."""
    from .defaults import TRAINER_TF32

    return TRAINER_TF32 if trainer else False


def _run(op_names, *, small, seed, repeat, isolate, command, progress, verbose, log, trainer=False, analyze=None,
         gpu=None, on_entry=None, tf32=None) -> dict:
    from tqdm import tqdm

    from . import harness
    from .ops import OpError
    from .runtime import backend as _backend

    if trainer:
        from .defaults import trainer_sizes

        op_names = list(op_names or trainer_sizes())
        others = [n for n in op_names if n not in trainer_sizes()]
        if others:
            raise OpError(f"--trainer-shapes: {', '.join(others)} is not an op of the training step; those "
                          f"are: {', '.join(trainer_sizes())}")
    plan = plan_for(op_names)
    tf32 = default_tf32(trainer) if tf32 is None else bool(tf32)
    backend = _backend.get_backend()
    isolate = True if isolate is None else isolate
    start = ("spawn" if backend == "cuda" else harness.emulator_start()) if isolate else None
    versions = harness.runner(start, env={"LLMCUPY_BACKEND": backend})
    # the metrics are counted by the emulator; on a GPU they would need a second, emulated run
    analyze = (backend == "sim") if analyze is None else (analyze and backend == "sim")
    date = _utc_now()
    record = {
        "schema": SCHEMA,
        "date": date.isoformat().replace("+00:00", "Z"),
        "command": command,   # run() names the CLI line or the Python call
        "backend": backend,
        "device": _backend.device_name(),
        "software": _software_versions(),
        "git": git_commit(),
        "host": platform.node(),
        "timed": backend == "cuda",
        "sizes": "trainer" if trainer else "sim_sizes" if (small or backend == "sim") else "sizes",
        "tf32": tf32,   # asked for; each entry's "tf32" says whether it took effect
        "seed": seed,
        "repeat": repeat,
        "ops": {},
        "results": [],
    }
    if backend != "cuda":
        record["no_timings"] = NO_TIMING_REASON
    from . import ops as registry

    for name in dict.fromkeys(n for n, _ in plan):
        op = registry.get(name)
        record["ops"][name] = {"summary": op.summary, "default_version": op.default_version,
                               "source": kernel_source_digest(op.source), "launcher": launcher_digest(name),
                               "bound": None if op.bound is None else op.bound.kind,
                               "tolerance": {k: _tolerance_record(v) for k, v in op.tolerance.items()}}
        if tf32 and op.tf32_tolerance:
            record["ops"][name]["tf32_tolerance"] = {k: _tolerance_record(v) for k, v in op.tf32_tolerance.items()}

    def write(line: str):
        if log is not None:
            print(line, file=log, flush=True)
        elif progress:
            tqdm.write(line)
        else:
            print(line, flush=True)

    bar = None
    iterator = plan
    if progress:
        # disable=None: no bar (and no \r clutter in logs) when stderr is not a terminal
        bar = tqdm(plan, desc="bench", unit="version", file=sys.stderr, dynamic_ncols=True, disable=None)
        iterator = bar
    for op_name, number in iterator:
        if bar is not None:
            bar.set_postfix_str(f"{op_name} v{number}")
        try:
            raw = versions.call(_sweep_and_analyze, op_name, number, small, seed, repeat, analyze, gpu, trainer,
                                tf32=tf32)
        except (OpError, _backend.BackendError) as exc:
            raw = {"ok": False, "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - one version's crash must not lose the whole run
            raw = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        if "signal" in raw:   # the runner could not name the version in its --sanitize command
            raw = harness.died_by_signal(raw["signal"], backend == "sim", op_name, number)
        entry = _version_entry(op_name, number, raw)
        record["results"].append(entry)
        if verbose and "error" not in raw:
            write(harness.format_sweep(raw))
        else:
            write(format_entry(entry))
        if on_entry is not None:
            on_entry(record)
    versions.close()
    if bar is not None:
        bar.close()
    record["summary"] = _counts(record["results"])
    return record


def _counts(results) -> dict:
    return {"passed": sum(r.get("ok") is True for r in results),
            "failed": sum(r.get("ok") is False for r in results),
            "skipped": sum(r.get("ok") is None for r in results)}


def _worst_rel(block: dict) -> float | None:
    errs = [e.get("max_rel") for e in block.get("errors", {}).values() if e.get("max_rel") is not None]
    return max(errs) if errs else None


def _bound_name(bound: dict | None) -> str:
    """The upper bound a fraction_of_bound is of, named with its value (harness._bound's record)."""
    bound = bound or {}
    if bound.get("kind") == "memory" and bound.get("copy_gbs"):
        return f"the measured copy bandwidth ({bound['copy_gbs']:.0f} GB/s)"
    if bound.get("cublas_ms"):
        return f"cuBLAS's speed{' with TF32' if bound.get('tf32') else ''} ({bound['cublas_ms']:.4f} ms)"
    return "its upper bound"


def format_entry(entry: dict) -> str:
    """One line per (op, version): verdict, block sizes run, the best time and its share of the bound."""
    head = f"{entry['op']} v{entry['version']}{'*' if entry.get('default') else ''}"
    if entry.get("error"):
        return f"{head}: ERROR {entry['error']}"
    if entry.get("ok") is None:
        return f"{head}: SKIP ({entry.get('skipped', 'nothing ran')})"
    ran = [b for b in entry["blocks"] if b.get("ok") is not None]
    failed = [b for b in ran if b.get("ok") is False]
    rels = [r for r in (_worst_rel(b) for b in ran) if r is not None]
    line = f"{head}: {'PASS' if entry['ok'] else 'FAIL'} at {len(ran)} block size{'s' * (len(ran) != 1)}"
    if rels:
        line += f", max rel err {max(rels):.1e}"
    if failed:
        line += f" (failed at {', '.join(str(b['block_size']) for b in failed)})"
    best = entry.get("best")
    if best:
        line += f"; best {best['ms']:.4f} ms @ {best['block_size']}"
        if "gbs" in best:
            line += f", {best['gbs']:.0f} GB/s"
        if "tflops" in best:
            line += f", {best['tflops']:.2f} TFLOP/s"
        if "fraction_of_bound" in best:
            line += f", {100 * best['fraction_of_bound']:.0f}% of {_bound_name(entry.get('bound'))}"
    summary = entry.get("metrics", {}).get("summary")
    if summary:
        spr = summary.get("sectors_per_request")
        moved = summary.get("moved_over_ideal")
        line += (f"; metrics @ {entry['metrics'].get('block_size')}: "
                 + (f"{spr:.1f} sectors/req, " if spr is not None else "")
                 + (f"moved {moved:.2f}x ideal, " if moved is not None else "")
                 + (f"model {summary['model_seconds'] * 1e6:.3g} us on {entry['metrics'].get('model_gpu')}"
                    + (" + cuBLAS, not modelled" if summary.get("library_calls") else "")
                    if summary.get("model_seconds") else "no model"))
    return line


def result_filename(record: dict) -> str:
    date = record["date"].replace("-", "").replace(":", "")  # 20250101T120000Z
    commit = record.get("git", {}).get("commit", "unknown")
    commit = commit[:10] if commit != "unknown" else "nocommit"
    device = "sim" if record.get("backend") == "sim" else _slug(record.get("device", "gpu"))
    return f"{date}_{device}_{commit}.json"


def save(record: dict, out_dir: str | os.PathLike | None = None, path: Path | None = None) -> Path:
    """Writes the record to a new file in ``out_dir`` (or over ``path``, a file an earlier save of
    the same run made), atomically: a reader never sees half a record."""
    if path is None:
        out = Path(out_dir) if out_dir is not None else results_folder(record.get("backend", "cuda"))
        out.mkdir(parents=True, exist_ok=True)
        path = out / result_filename(record)
        n = 1
        while path.exists():  # two runs in the same second
            path = out / (result_filename(record)[:-5] + f"-{n}.json")
            n += 1
    from .fileio import atomic_write

    with atomic_write(path) as f:
        f.write((json.dumps(record, indent=1, default=str) + "\n").encode())
    return path


class _SaveAsYouGo:
    """``on_entry`` for the CLI: the record so far, marked ``"partial": true``, saved after every
    version to one file, so a run stopped by a time limit keeps what it measured."""

    def __init__(self, out_dir):
        self.out_dir, self.path, self.record = out_dir, None, None

    def __call__(self, record: dict) -> None:
        self.record = record   # the run's own dict, which it extends in place
        self.path = save(dict(record, partial=True), self.out_dir, self.path)

    def final(self, record: dict) -> Path:
        return save(record, self.out_dir, self.path)


class OtherRecord(ValueError):
    """A JSON object that is another tool's record, not a run of this benchmark: the start-up times
    (``python -m llmcupy.startup`` writes them to ``bench/results/`` too), a profile, the side-by-side
    step times. Readers of the whole folder skip it; a reader of one file refuses it."""


def load(path: str | os.PathLike) -> dict:
    """A results file: this module's record, or a ``python -m llmcupy.kernel --json`` list (wrapped).
    Raises ValueError naming the file (:class:`OtherRecord` for another tool's record)."""
    try:
        data = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a benchmark record (not JSON: {exc})") from None

    def entries(items) -> bool:   # what the formatting and comparing below index into
        return isinstance(items, list) and all(isinstance(r, dict) and "op" in r and "version" in r for r in items)

    if isinstance(data, list) and not entries(data):
        raise ValueError(f"{path}: not a benchmark record (a list, but not of python -m llmcupy.kernel --json "
                         "results, which have 'op' and 'version')")
    if isinstance(data, list):  # the kernel CLI's --json: a list of harness sweeps
        results = [_version_entry_from_raw(r) for r in data]
        def first(key, default):   # the kernel CLI stamps every entry (lists from before it: none)
            return next((r[key] for r in data if r.get(key)), default)

        backend = first("backend", "unknown")
        return {"schema": "llmcupy.kernel", "date": first("date", "unknown"), "command": first("command", "unknown"),
                "backend": backend, "device": first("device", "unknown"), "software": {},
                "git": first("git", {"commit": "unknown"}), "timed": backend == "cuda", "ops": {}, "results": results}
    if isinstance(data, dict) and "results" not in data and not str(data.get("schema", "")).startswith("llmcupy.bench"):
        exc = OtherRecord(f"{path}: not a benchmark record (no 'results'"
                          + (f"; schema {data['schema']})" if data.get("schema") else ")"))
        exc.schema = data.get("schema")
        raise exc
    if not isinstance(data, dict) or "results" not in data:
        raise ValueError(f"{path}: not a benchmark record (no 'results')")
    if not entries(data["results"]):
        raise ValueError(f"{path}: not a benchmark record ('results' is not a list of entries with 'op' and "
                         "'version')")
    return data


def _version_entry_from_raw(raw: dict, default: bool | None = None) -> dict:
    """A harness sweep (or a failed run's ``{"ok": False, "error": ...}``) as a record entry."""
    entry = {"op": raw.get("op"), "version": raw.get("version"), "summary": raw.get("summary", "")}
    if default is not None:
        entry["default"] = default
    entry["ok"] = raw.get("ok")
    for k in ("skipped", "error", "sizes", "bound", "tf32"):
        if raw.get(k) is not None:
            entry[k] = raw[k]
    entry["blocks"] = [_block_entry(b) for b in raw.get("blocks", [])]
    if raw.get("analysis"):
        entry["metrics"] = _metrics_entry(raw["analysis"])
    timed = [b for b in entry["blocks"] if b.get("ok") and b.get("ms") is not None]
    if timed:
        best = min(timed, key=lambda b: b["ms"])
        entry["best"] = {k: best[k] for k in ("block_size", "ms", "gbs", "tflops", "fraction_of_bound") if k in best}
    return entry


def _metrics_entry(analysis: dict) -> dict:
    """An analysis (``llmcupy.analyze.analyze_version``) as a record's ``metrics``: the summary, and per
    launch its totals, per-kind and per-line counts, occupancy and model (the raw site rows dropped)."""
    out = {k: analysis[k] for k in ("block_size", "sizes", "ideal_bytes", "ideal_source", "skipped",
                                    "resources_note") if k in analysis}
    out["model_gpu"] = analysis["gpu"]["key"]
    if "summary" in analysis:
        out["summary"] = analysis["summary"]
        out["launches"] = [{k: l[k] for k in ("kernel", "grid", "block", "shared_mem", "totals", "kinds", "lines",
                                              "occupancy", "model")} for l in analysis["launches"]]
    return out


# ----------------------------------------------------------------------------------------------
# plotting


def _by_op(record: dict) -> dict:
    ops: dict[str, list] = {}
    for r in record["results"]:
        ops.setdefault(r["op"], []).append(r)
    return ops


def _has_times(record: dict) -> bool:
    return any(b.get("ms") is not None for r in record["results"] for b in r.get("blocks", []))


def _has_metrics(record: dict) -> bool:
    """Whether a version of the run holds the emulator's counts (``--analyze`` metrics)."""
    return any((r.get("metrics") or {}).get("summary") for r in record["results"])


def _block_label(bs) -> str:
    return "fixed" if bs is None else str(bs)


def _block_axis(entries) -> list:
    sizes = {b.get("block_size") for e in entries for b in e.get("blocks", [])}
    return ([None] if None in sizes else []) + sorted(s for s in sizes if s is not None)


_MARKERS = "os^vD<>ph*XP"


def plot_results(record: dict, path: str | os.PathLike | None = None, *, ops=None, columns: int | None = None):
    """Plots a run: one panel per op (time per block size, one line per version) and a bar chart of each
    op's best version as a fraction of its upper bound. A record without GPU times (the emulator) gets
    the max relative error per block size on a log axis instead, and a pass/fail/skip count per op.

    Writes a PNG (or any format matplotlib knows from the suffix) when ``path`` is given; returns the
    :class:`matplotlib.figure.Figure`. Uses the Agg canvas directly, so no global backend is changed.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    by_op = _by_op(record)
    if ops:
        by_op = {k: v for k, v in by_op.items() if k in set(ops)}
    if not by_op:
        raise ValueError("nothing to plot: the record has no results" + (f" for {', '.join(ops)}" if ops else ""))
    timed = _has_times(record)
    n = len(by_op)
    cols = columns or (1 if n == 1 else 2 if n <= 4 else 3)
    rows = math.ceil(n / cols)
    # a second row of panels per op when the record holds memory-traffic metrics (emulator runs)
    traffic = {k: v for k, v in by_op.items() if any(e.get("metrics", {}).get("summary") for e in v)}
    traffic_rows = math.ceil(len(traffic) / cols) if traffic else 0
    panel_w, panel_h = (9.0, 5.0) if cols == 1 else (6.6, 4.4)
    summary_h = max(1.9, 0.36 * n + 1.3)
    fig = Figure(figsize=(panel_w * cols, panel_h * (rows + traffic_rows) + summary_h + 1.0), dpi=110,
                 layout="constrained")
    FigureCanvasAgg(fig)
    gs = fig.add_gridspec(rows + traffic_rows + 1, cols, height_ratios=[panel_h] * (rows + traffic_rows) + [summary_h])

    device = record.get("device", "unknown device")
    commit = record.get("git", {}).get("commit", "unknown")
    when = record.get("date", "")
    if timed:
        fig.suptitle(f"llmcupy kernel sweep on {device}\n{when}, commit {commit[:10]}", fontsize=13)
    else:
        fig.suptitle(f"{EMULATOR_TITLE}\n{device}, {when}, commit {commit[:10]}", fontsize=13, color="#7a1f1f")

    for i, (op_name, entries) in enumerate(by_op.items()):
        ax = fig.add_subplot(gs[i // cols, i % cols])
        _plot_op_panel(ax, op_name, entries, timed)
    for i, (op_name, entries) in enumerate(traffic.items()):
        ax = fig.add_subplot(gs[rows + i // cols, i % cols])
        _plot_traffic_panel(ax, op_name, entries)

    ax = fig.add_subplot(gs[rows + traffic_rows, :])
    if timed:
        _plot_bound_summary(ax, by_op)
    else:
        _plot_status_summary(ax, by_op)
    if path is not None:
        fig.savefig(path)
    return fig


def check_plot_path(path) -> None:
    """Before anything runs: ``--plot PATH`` names a format matplotlib writes (asked of its canvas, not
    a list kept here) and a file that can be written. Raises ``_cli.BadPath``; ImportError without
    matplotlib."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from ._cli import BadPath, check_output_file

    suffix = Path(path).suffix.lower().lstrip(".")
    formats = FigureCanvasAgg.get_supported_filetypes()   # {"png": "Portable Network Graphics", ...}
    if suffix and suffix not in formats:   # no suffix: matplotlib writes its default format (PNG)
        raise BadPath(f"--plot {path}: matplotlib cannot write .{suffix} files; use one of "
                      f"{', '.join('.' + f for f in sorted(formats))}")
    check_output_file(path, "--plot")


def _plot_op_panel(ax, op_name: str, entries: list, timed: bool):
    from matplotlib.ticker import LogFormatterSciNotation, LogLocator

    axis = _block_axis(entries)
    xpos = {bs: i for i, bs in enumerate(axis)}
    runnable = [e for e in entries if any(b.get("ok") is not None for b in e.get("blocks", []))]
    nlines = max(len(runnable), 1)
    floor = 1e-9
    any_floor = False
    any_fail = False
    for k, e in enumerate(runnable):
        pts = [b for b in e["blocks"] if b.get("ok") is not None]
        # dodge: versions at the same value stay visible side by side
        dx = (k - (nlines - 1) / 2) * min(0.5 / nlines, 0.08)
        xs, ys, bad = [], [], []
        for b in pts:
            if timed:
                y = b.get("ms")
                if y is None:  # failed (not timed)
                    bad.append(xpos[b.get("block_size")] + dx)
                    continue
            else:
                y = _worst_rel(b)
                if y is None:
                    continue
                if y < floor:
                    y, any_floor = floor, True
            xs.append(xpos[b.get("block_size")] + dx)
            ys.append(y)
            if b.get("ok") is False:
                bad.append(xs[-1])
        label = f"v{e['version']}{'*' if e.get('default') else ''}"
        if e.get("ok") is False:
            label += " FAIL"
        marker = _MARKERS[k % len(_MARKERS)]
        line, = ax.plot(xs, ys, marker=marker, markersize=6, linewidth=1.4, label=label)
        if not timed:
            for x, y, b in zip(xs, ys, pts):
                if b.get("ok") is False:
                    ax.plot([x], [y], marker="x", color="red", markersize=11, markeredgewidth=2.5)
                    any_fail = True
        elif bad:
            any_fail = True
            ymin = min([y for y in ys] or [1.0])
            ax.plot(bad, [ymin] * len(bad), linestyle="none", marker="x", color="red", markersize=11,
                    markeredgewidth=2.5)
    ax.set_yscale("log")
    values = [y for line in ax.get_lines() for y in line.get_ydata()]
    if values:
        # whole decades, at least one: a narrow spread still reads against 1e-7, 1e-6, ...
        lo = 10 ** math.floor(math.log10(min(values)) + 1e-9)
        hi = 10 ** math.ceil(math.log10(max(values)) - 1e-9)
        if min(values) <= lo * 1.05:  # a point on the bottom edge
            lo /= 10
        if max(values) >= hi / 1.05:
            hi *= 10
        ax.set_ylim(lo, hi)
    ax.yaxis.set_major_locator(LogLocator(base=10, numticks=12))
    # over one or two decades, label the minor ticks too (2e-7, 3e-7, ...): the values are readable
    ax.yaxis.set_minor_formatter(LogFormatterSciNotation(labelOnlyBase=False, minor_thresholds=(2.1, 1.1)))
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_xticks(range(len(axis)))
    ax.set_xticklabels([_block_label(b) for b in axis])
    if axis:   # an op none of whose versions ran has no block size (matplotlib warns on an empty range)
        ax.set_xlim(-0.5, len(axis) - 0.5)
    ax.set_xlabel("block size")
    ax.grid(True, which="major", alpha=0.35)
    skipped = [e for e in entries if e not in runnable]
    if timed:
        ax.set_ylabel("time (ms, lower is better)")
        title = op_name
        bound = next((e.get("bound") for e in entries if e.get("bound")), None)
        sizes = next((e.get("sizes") for e in entries if e.get("sizes")), None)
        if bound and bound.get("kind") == "memory" and bound.get("copy_gbs"):
            best_ms = bound["bytes"] / (bound["copy_gbs"] * 1e9) * 1e3
            ax.axhline(best_ms, color="black", linestyle="--", linewidth=1.2, label="bound")
            bound_text = f"bound {best_ms:.3g} ms: {bound['bytes'] / 1e6:.4g} MB at copy bw {bound['copy_gbs']:.0f} GB/s"
        elif bound and bound.get("cublas_ms"):
            ax.axhline(bound["cublas_ms"], color="black", linestyle="--", linewidth=1.2, label="bound")
            bound_text = (f"bound: cuBLAS{' TF32' if bound.get('tf32') else ''} {bound['cublas_ms']:.3g} ms "
                          f"({bound.get('cublas_tflops', 0):.1f} TFLOP/s)")
        else:
            bound_text = ""
    else:
        ax.set_ylabel("max relative error (log)")
        title = f"{op_name} (emulator: correctness only)"
        sizes = next((e.get("sizes") for e in entries if e.get("sizes")), None)
    if sizes:
        title += "\n" + " ".join(f"{k}={v}" for k, v in sizes.items())
    if timed and bound_text:
        title += "\n" + bound_text
    ax.set_title(title, fontsize=10)
    notes = []
    if any_floor:
        notes.append(f"exact (0) shown at {floor:g}")
    if any_fail:
        notes.append("red x = failed validation")
    if skipped:
        notes.append("not run: " + ", ".join(f"v{e['version']}" for e in skipped))
    if notes:
        ax.text(0.01, 0.01, "; ".join(notes), transform=ax.transAxes, fontsize=7.5, va="bottom", ha="left",
                color="#444444", bbox=dict(facecolor="white", alpha=0.8, edgecolor="none", pad=1.5))
    if runnable:
        ax.legend(fontsize=8, ncol=2 if len(runnable) > 6 else 1, loc="upper left", bbox_to_anchor=(1.0, 1.0),
                  borderaxespad=0.0, frameon=False, title="version\n(* default)", title_fontsize=8)


def _plot_traffic_panel(ax, op_name: str, entries: list):
    """Bytes moved against the op's ideal bytes, per version (emulator metrics): the bytes in the
    32-byte sectors the warps' requests touched and the unique bytes (a lower bound of DRAM traffic),
    each as a multiple of the ideal; labels give sectors per request and the model's time."""
    rows = [(e, e["metrics"]) for e in entries if e.get("metrics", {}).get("summary")]
    xs = list(range(len(rows)))
    moved = [m["summary"].get("moved_over_ideal") or 0.0 for _, m in rows]
    unique = [m["summary"].get("unique_over_ideal") or 0.0 for _, m in rows]
    w = 0.38
    ax.bar([x - w / 2 for x in xs], moved, width=w, color="#d95f0e", label="bytes in sectors moved")
    ax.bar([x + w / 2 for x in xs], unique, width=w, color="#2c7fb8", label="unique bytes (DRAM lower bound)")
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1.2, label="ideal (1.0)")
    ax.set_yscale("log")
    top = max(moved + unique + [1.0])
    ax.set_ylim(min([v for v in moved + unique if v > 0] + [1.0]) / 2, top * 4)
    for x, (e, m) in zip(xs, rows):
        s = m["summary"]
        text = []
        if s.get("sectors_per_request") is not None:
            text.append(f"{s['sectors_per_request']:.1f} sec/req")
        if s.get("conflict_ways"):
            text.append(f"{s['conflict_ways']:.1f}-way smem")
        if s.get("model_seconds"):
            text.append(f"{s['model_seconds'] * 1e6:.3g} us")
        ax.text(x, max(moved[x], unique[x]) * 1.15, "\n".join(text), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"v{e['version']}{'*' if e.get('default') else ''}\n@{m.get('block_size')}" for e, m in rows],
                       fontsize=8)
    ax.set_ylabel("bytes / ideal bytes (log)")
    gpu = next((m.get("model_gpu") for _, m in rows), "")
    ax.set_title(f"{op_name}: memory traffic per version (emulator counts)\n"
                 f"labels: sectors per request, model time on {gpu} (a model, not a measurement)", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(True, axis="y", alpha=0.35)


def _plot_bound_summary(ax, by_op: dict):
    names, fracs, labels, colors = [], [], [], []
    for op_name, entries in by_op.items():
        # only versions that passed: a fast wrong kernel is not a best version
        bests = [(e["best"], e) for e in entries
                 if e.get("ok") is True and e.get("best") and e["best"].get("fraction_of_bound") is not None]
        names.append(op_name)
        if not bests:
            fracs.append(0.0)
            labels.append("no bound / not timed")
            colors.append("#bbbbbb")
            continue
        b, e = max(bests, key=lambda p: p[0]["fraction_of_bound"])
        fracs.append(b["fraction_of_bound"])
        rate = f"{b['gbs']:.0f} GB/s" if "gbs" in b else (f"{b['tflops']:.2f} TFLOP/s" if "tflops" in b else "")
        bound = "copy bw" if "gbs" in b else ("cuBLAS TF32" if (e.get("bound") or {}).get("tf32") else "cuBLAS")
        labels.append(f"v{e['version']} @ {b['block_size']}: {100 * b['fraction_of_bound']:.0f}% of {bound}"
                      f" ({b['ms']:.3g} ms, {rate})")
        colors.append("#2c7fb8" if "gbs" in b else "#d95f0e")
    y = list(range(len(names)))[::-1]
    ax.barh(y, fracs, color=colors, height=0.55 if len(names) > 2 else 0.4)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1.2)
    ax.set_yticks(y)
    ax.set_yticklabels(names, fontsize=9)
    ax.set_ylim(-0.9, len(names) - 0.1)
    top = max(fracs + [1.0]) * 1.9
    ax.set_xlim(0, top)
    for yi, f, text in zip(y, fracs, labels):
        ax.text(f + top * 0.01, yi, text, va="center", fontsize=8)
    ax.set_xlabel("best version's fraction of its upper bound (dashed: 1.0 = the bound)\n"
                  "blue: memory-bound, vs measured copy bandwidth; orange: GEMM-shaped, vs cuBLAS")
    ax.set_title("each op's best version against its upper bound", fontsize=11)
    ax.grid(True, axis="x", alpha=0.35)


def _plot_status_summary(ax, by_op: dict):
    names = list(by_op)
    y = list(range(len(names)))[::-1]
    counts = {k: [sum(e.get("ok") is v for e in by_op[n]) for n in names]
              for k, v in (("passed", True), ("failed", False), ("skipped", None))}
    left = [0] * len(names)
    for key, color in (("passed", "#4daf4a"), ("failed", "#e41a1c"), ("skipped", "#bbbbbb")):
        ax.barh(y, counts[key], left=left, color=color, height=0.55 if len(names) > 2 else 0.4, label=key)
        left = [a + b for a, b in zip(left, counts[key])]
    for yi, p, f, s in zip(y, counts["passed"], counts["failed"], counts["skipped"]):
        ax.text(p + f + s + 0.1, yi, f"{p} passed" + (f", {f} FAILED" if f else "") + (f", {s} skipped" if s else ""),
                va="center", fontsize=8)
    ax.set_yticks(y)
    ax.set_yticklabels(names, fontsize=9)
    ax.set_ylim(-0.9, len(names) - 0.1)
    ax.set_xlim(0, max(left + [1]) * 1.6)
    ax.set_xlabel("versions\n(no fraction-of-bound chart: the emulator has no GPU timings)")
    ax.set_title(f"{EMULATOR_TITLE}: versions validated per op", fontsize=11)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, axis="x", alpha=0.35)


# ----------------------------------------------------------------------------------------------
# comparing two runs


def _key_entries(record: dict) -> dict:
    return {(r["op"], int(r["version"])): r for r in record["results"]}


def _verdict(entry: dict | None) -> str:
    if entry is None:
        return "-"
    if entry.get("error"):
        return "ERROR"
    return {True: "PASS", False: "FAIL", None: "SKIP"}[entry.get("ok")]


def _best_ms(entry: dict | None):
    if not entry or not entry.get("best"):
        return None, None
    return entry["best"].get("ms"), entry["best"].get("block_size")


def _fmt_ms(v) -> str:
    return f"{v:10.4f}" if v is not None else f"{'-':>10}"


def _fmt_blk(bs, shown) -> str:
    return f"{'(' + _block_label(bs) + ')':>6}" if shown else " " * 6


def compare(before: dict, after: dict, blocks: bool = False) -> tuple[str, bool]:
    """A table of per op/version deltas (best ms before, after, speed-up) and correctness changes.
    Where neither run holds a time (emulator runs), the table has no time columns and a line says why.

    Returns ``(text, regressed)``: ``regressed`` is True when a version that passed before fails (or
    errors) after.
    """
    b_map, a_map = _key_entries(before), _key_entries(after)
    keys = list(dict.fromkeys([*b_map, *a_map]))
    lines = []

    def describe(tag, rec):
        commit = rec.get("git", {}).get("commit", "unknown")
        dirty = " (dirty)" if rec.get("git", {}).get("dirty") else ""
        return f"{tag} {rec.get('device', '?')}, {rec.get('backend', '?')}, {rec.get('date', '?')}, commit {commit[:10]}{dirty}"

    lines.append(describe("before:", before))
    lines.append(describe("after: ", after))
    if before.get("device") != after.get("device"):
        lines.append("warning: the two runs are on different devices; the times are not comparable")
    lines += _compare_sources(before, after)
    tf32 = [bool(rec.get("tf32")) for rec in (before, after)]   # records from before bench set it ran without
    if tf32[0] != tf32[1]:
        lines.append(f"warning: TF32 was {'on' if tf32[0] else 'off'} before and {'on' if tf32[1] else 'off'} "
                     "after: the versions that call cuBLAS are not comparable")
    timed = _has_times(before) or _has_times(after)
    if not timed:
        # columns of dashes would read as times lost; say once why there are none
        backends = {before.get("backend"), after.get("backend")}
        if backends == {"sim"}:
            why = ("both are emulator runs, which run the kernels on the CPU and never time a GPU; below, each "
                   "version's verdict" + (" and the emulator's counts" if _has_metrics(before) and _has_metrics(after)
                                          else ""))
        elif backends == {"cuda"}:
            why = "no version passed in either GPU run, and only a passing block size is timed"
        else:
            why = "neither run holds a time (an emulator run's, or a GPU run in which no version passed)"
        lines.append(f"no times: {why}")
        header = f"{'op':<30} {'ver':>4}  {'(blk)':>6}  correctness" if blocks else f"{'op':<30} {'ver':>4}  correctness"
    else:
        header = (f"{'op':<30} {'ver':>4}  {'before ms':>10} {'(blk)':>6}  {'after ms':>10} {'(blk)':>6}  "
                  f"{'speed-up':>8}  correctness")
    lines += ["", header, "-" * len(header)]
    regressed = False
    speedups = []
    for key in keys:
        b, a = b_map.get(key), a_map.get(key)
        bms, bblk = _best_ms(b)
        ams, ablk = _best_ms(a)
        vb, va = _verdict(b), _verdict(a)
        if b is None:
            corr = f"only in after ({va})"
        elif a is None:
            corr = f"only in before ({vb})"
        elif vb == va:
            corr = va
        else:
            corr = f"{vb} -> {va}"
            if vb == "PASS" and va in ("FAIL", "ERROR"):
                corr += "  REGRESSION"
                regressed = True
            elif vb in ("FAIL", "ERROR") and va == "PASS":
                corr += "  fixed"
        other_sizes = a is not None and b is not None and a.get("sizes") and b.get("sizes") and a["sizes"] != b["sizes"]
        if other_sizes:
            corr += "  (sizes differ)"
        if bms and ams and not other_sizes:   # a ratio of times at other sizes is no speed-up
            sp = bms / ams
            if vb == va == "PASS":
                speedups.append(sp)
            spt = f"{sp:7.2f}x"
        else:
            spt = f"{'-':>8}"
        if timed:
            lines.append(f"{key[0]:<30} {key[1]:>4}  {_fmt_ms(bms)} {_fmt_blk(bblk, bms)}  "
                         f"{_fmt_ms(ams)} {_fmt_blk(ablk, ams)}  {spt}  {corr}")
        else:
            lines.append(f"{key[0]:<30} {key[1]:>4}  {' ' * 6 + '  ' if blocks else ''}{corr}")
        if blocks and a is not None and b is not None:
            bb = {x.get("block_size"): x for x in b.get("blocks", [])}
            ab = {x.get("block_size"): x for x in a.get("blocks", [])}
            for bs in dict.fromkeys([*bb, *ab]):
                x, y = bb.get(bs), ab.get(bs)
                xm = x.get("ms") if x else None
                ym = y.get("ms") if y else None
                sp = f"{xm / ym:7.2f}x" if xm and ym and not other_sizes else f"{'-':>8}"
                okx = {True: "PASS", False: "FAIL", None: "SKIP"}[x.get("ok")] if x else "-"
                oky = {True: "PASS", False: "FAIL", None: "SKIP"}[y.get("ok")] if y else "-"
                verdict = okx if okx == oky else okx + ' -> ' + oky
                if timed:
                    lines.append(f"{'':<30} {'':>4}  {_fmt_ms(xm)} {_fmt_blk(bs, True)}  {_fmt_ms(ym)} "
                                 f"{_fmt_blk(bs, True)}  {sp}  {verdict}")
                else:
                    lines.append(f"{'':<30} {'':>4}  {_fmt_blk(bs, True)}  {verdict}")
    analysed, counted = _compare_metrics(b_map, a_map, keys)
    lines.append("")
    lines += analysed
    if speedups:
        geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
        lines.append(f"{len(speedups)} versions passing and timed in both at the same sizes: geometric-mean "
                     f"speed-up {geo:.2f}x, "
                     f"min {min(speedups):.2f}x, max {max(speedups):.2f}x (best block size of each)")
    elif timed:   # (without a time in either run, the line above the table said why)
        lines.append("no version has times in both runs (passing, at the same sizes): no speed-up to give")
    lines.append("correctness: " + ("REGRESSED (a version that passed before fails now)" if regressed
                                    else "no version that passed before fails now"))
    return "\n".join(lines), regressed


def _compare_sources(before: dict, after: dict) -> list:
    """Which ops' sources differ between the runs, for the ops both records describe: the kernel file
    (its ``source`` digest, headers included) and the op's launcher module (``launcher``). Nothing
    where either record predates the digests (or is a kernel --json list)."""
    both = [name for name in (before.get("ops") or {}) if name in (after.get("ops") or {})]
    compared, changed = 0, []
    for name in both:
        parts = []
        for key, what in (("source", "kernel file"), ("launcher", "launcher")):
            b, a = before["ops"][name].get(key), after["ops"][name].get(key)
            if b and a and b != a:
                parts.append(what)
        if before["ops"][name].get("source") and after["ops"][name].get("source"):
            compared += 1
            if parts:
                changed.append(f"{name} ({' and '.join(parts)})")
    if not compared:
        return []
    if not changed:
        return [f"sources (kernel files and launchers): the same in both runs ({compared} op(s))"]
    return [f"sources that differ between the runs: {', '.join(changed)} ({len(changed)} of {compared} op(s))"]


# the op-level figures of an emulator record's ``metrics`` that compare sets side by side: the summary
# key, its column, its format (the columns of ``--analyze``'s table of versions)
_METRIC_COLUMNS = (("global_requests", "gld/gst req", "d"), ("sectors_per_request", "sectors/req", ".2f"),
                   ("moved_over_ideal", "moved/ideal", ".2f"), ("unique_over_ideal", "unique/ideal", ".2f"),
                   ("shared_requests", "smem req", "d"), ("conflict_ways", "bank ways", ".2f"),
                   ("occupancy", "occupancy", ".0%"))


def _before_after(before, after) -> str:
    """One cell: the value, or ``before -> after`` when the two differ as printed."""
    return before if before == after else f"{before} -> {after}"


def _compare_metrics(b_map: dict, a_map: dict, keys: list) -> tuple[list, int]:
    """The lines comparing the ``metrics`` (emulator counts and the roofline model) of the versions
    analysed in both runs: per version each figure before -> after, the model's time and the ratio of
    the model's times; and how many versions they compare (0: at most a note that one run has none)."""
    from .analyze import GPUS, _table, _us

    def summary(entry):
        return ((entry or {}).get("metrics") or {}).get("summary")

    both = [k for k in keys if summary(b_map.get(k)) and summary(a_map.get(k))]
    lines = []
    one_sided = [tag for tag, m in (("before", b_map), ("after", a_map)) if not any(summary(e) for e in m.values())]
    if not both:
        if len(one_sided) == 1:
            lacking = one_sided[0]
            holding = "after" if lacking == "before" else "before"
            entries = (b_map if lacking == "before" else a_map).values()
            if not any(e.get("ok") is not None and not e.get("error") for e in entries):
                # most often an edit that broke the kernel file: nothing ran, so nothing was analysed
                lines += [f"only the {holding} run holds emulator counts (--analyze metrics): no version of the "
                          f"{lacking} run ran to a result (each is an ERROR or a SKIP above), so there are none "
                          "to compare", ""]
            else:   # the other run was made with --no-analyze, or by an older llmcupy
                lines += [f"only the {holding} run holds emulator counts (--analyze metrics), so they are not "
                          "compared; an emulator bench run records them unless --no-analyze", ""]
        return lines, 0

    def gpu_name(key):
        return GPUS[key].name if key in GPUS else str(key)

    def cell(value, fmt):
        return "-" if value is None else format(value, fmt)

    rows, notes_of, changed, gpus = [], [], [], {}
    for key in both:
        bm, am = b_map[key]["metrics"], a_map[key]["metrics"]
        bs, as_ = bm["summary"], am["summary"]
        gpus[bm.get("model_gpu"), am.get("model_gpu")] = None   # in order: the before run's GPU first
        row = [key[0], str(key[1]),
               _before_after(_block_label(bm.get("block_size")), _block_label(am.get("block_size")))]
        row += [_before_after(cell(bs.get(k), fmt), cell(as_.get(k), fmt)) for k, _, fmt in _METRIC_COLUMNS]
        bt, at = bs.get("model_seconds"), as_.get("model_seconds")
        row.append(_before_after(_us(bt), _us(at)))
        notes = []
        other_sizes = bm.get("sizes") != am.get("sizes")
        other_gpu = bm.get("model_gpu") != am.get("model_gpu")
        if other_sizes:
            notes.append("sizes differ")
        if other_gpu:
            notes.append(f"model on {gpu_name(bm.get('model_gpu'))} -> {gpu_name(am.get('model_gpu'))}")
        if bs.get("library_calls") or as_.get("library_calls"):
            # the emulator runs cuBLAS in NumPy: the model covers the version's own kernels only
            notes.append("+ cuBLAS, not modelled" if bs.get("launches") or as_.get("launches")
                         else "no kernel launch (library call)")
        # a ratio of models at other sizes or of other GPUs says nothing about the change
        row.append(f"{bt / at:.2f}x" if bt and at and not other_sizes and not other_gpu else "-")
        if any("->" in c for c in row[2:-1]):
            changed.append(f"{key[0]} {key[1]}")
        rows.append(row)
        notes_of.append(f"  ({', '.join(notes)})" if notes else "")
    names = dict.fromkeys(gpu_name(g) for pair in gpus for g in pair)
    lines.append(f"emulator counts and a roofline MODEL of the time on {' / '.join(names)} (not a measurement), "
                 "before -> after where they differ:")
    if any(b != a for b, a in gpus):
        lines.append("warning: the two runs model different GPUs (--gpu); their model times and occupancies are "
                     "not comparable")
    head = ["op", "ver", "block"] + [h for _, h, _ in _METRIC_COLUMNS] + ["model time", "model ratio"]
    table = _table(head, rows, indent="")
    lines += table[:1] + [line + note for line, note in zip(table[1:], notes_of)]
    lines.append("model ratio: the model's time before over after (above 1: the model predicts the after run faster)")
    lines.append(f"{len(changed)} of {len(both)} versions analysed in both differ in their counts or model time"
                 + (f": {', '.join(changed)}" if changed and len(changed) <= 10 else ""))
    lines.append("")
    return lines, len(both)


# ----------------------------------------------------------------------------------------------
# listing recorded runs


def list_results(out_dir) -> str:
    """One line per record under ``out_dir`` (a sweep's counts, or what another tool's record is)."""
    paths = sorted(glob.glob(os.path.join(str(out_dir), "*.json")))
    if not paths:
        return f"no results under {out_dir}/"
    lines = []
    for p in paths:
        try:
            r = load(p)
        except OtherRecord:
            lines.append(f"{p}: {_other_record_text(p)}")
            continue
        except (ValueError, OSError, json.JSONDecodeError) as exc:
            lines.append(f"{p}: unreadable ({exc})")
            continue
        c = _counts(r["results"])
        ops = len({e["op"] for e in r["results"]})
        timed = ("timed" if r.get("timed") else "correctness only") + (", stopped early" if r.get("partial") else "")
        lines.append(f"{p}: {r.get('date', '?')} {r.get('device', '?')} commit {r.get('git', {}).get('commit', '?')[:10]}"
                     f" - {ops} ops, {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped ({timed})")
    return "\n".join(lines)


def timed_runs(out_dir=None) -> list:
    """``[(path, record)]`` of the timed (GPU) runs under ``out_dir`` (default: :func:`results_folder`),
    oldest first by their recorded date (file names do not sort by date: ``catalogue.json``). Other tools' records there (start-up
    times, profiles) are skipped; a broken file raises ValueError naming it."""
    runs = []
    for path in sorted(Path(out_dir if out_dir is not None else results_folder()).glob("*.json")):
        try:
            record = load(path)
        except OtherRecord:
            continue
        if record.get("timed"):
            runs.append((path, record))
    return sorted(runs, key=lambda run: record_date(run[1]))


def record_date(record: dict) -> str:
    """The record's ISO date for sorting; "" (the oldest) when it has none ("unknown": a kernel --json
    list from before the kernel CLI stamped its entries)."""
    date = str(record.get("date") or "")
    return date if date[:1].isdigit() else ""


def _other_record_text(path) -> str:
    """What --list-results says of another tool's record (load raised OtherRecord: a JSON object)."""
    data = json.loads(Path(path).read_text())
    what = f"a {data['schema']} record" if data.get("schema") else "a record"
    when = " ".join(str(data[k]) for k in ("date", "device") if data.get(k))
    return f"{what}{' (' + when + ')' if when else ''}, not a benchmark run"


# ----------------------------------------------------------------------------------------------
# CLI


def _parser() -> argparse.ArgumentParser:
    import shutil
    import textwrap

    from .analyze import DEFAULT_GPU, GPUS

    width = max(40, min(100, shutil.get_terminal_size().columns) - 2)
    p = argparse.ArgumentParser(
        prog="python -m llmcupy.bench",
        # RawDescription keeps the epilog's example lines; the description is wrapped here
        description=textwrap.fill(
            "Sweep every version of every op (validate; on a GPU time against the op's upper bound; in the "
            "emulator count memory traffic and model the time instead), record the run as JSON, plot it. "
            "Two subcommands, each with its own --help: `python -m llmcupy.bench compare BEFORE.json "
            "AFTER.json` compares two runs, `python -m llmcupy.bench defaults` writes the trainer's measured "
            "kernel defaults from the --trainer-shapes runs.", width),
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n")[1])
    p.add_argument("--ops", nargs="+", metavar="OP", help="only these ops (default: the whole catalogue)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="where the JSON goes (default: this checkout's bench/results/ on a GPU, bench/results/sim/ "
                        "in the emulator, whatever the working folder; a DIR you give is relative to the working folder)")
    p.add_argument("--no-save", action="store_true", help="do not write a results file")
    p.add_argument("--plot", metavar="PATH", help="write the plots to PATH (PNG, SVG, PDF by suffix)")
    p.add_argument("--from", dest="from_file", metavar="RESULTS.json",
                   help="run nothing: plot (--plot) or print a recorded results file")
    p.add_argument("--list-results", action="store_true",
                   help="list the runs recorded under --out (default: this checkout's bench/results/ and "
                        "bench/results/sim/, where GPU and emulator runs go)")
    p.add_argument("--small", action="store_true", help="use the ops' small sim_sizes on a GPU too (a quick check)")
    p.add_argument("--trainer-shapes", action="store_true",
                   help="GPU: the training step's ops at the trainer's shapes (GPT-2 124M, B=4, T=1024), the runs "
                        "`python -m llmcupy.bench defaults` picks the trainer's defaults from")
    p.add_argument("--tf32", type=int, choices=(0, 1), default=None,
                   help="TF32 for cuBLAS's FP32 GEMMs on sm_80+ (default: on with --trainer-shapes, as the trainer's "
                        "--tf32 default, so the defaults are picked at the speed and accuracy the trainer gets; "
                        "off otherwise). Versions that call cuBLAS under TF32 are checked at their op's TF32 "
                        "tolerance")
    p.add_argument("--backend", choices=("auto", "cuda", "sim"), default=None,
                   help="cuda, sim or auto (default: auto, or LLMCUPY_BACKEND: cuda when CuPy sees a GPU, else sim)")
    p.add_argument("--seed", type=int_at_least(0), default=0,
                   help="seed of the random inputs (default 0; keep it the same in a before/after pair)")
    p.add_argument("--repeat", type=int_at_least(1), default=50, help="timed launches per block size (GPU; default 50)")
    p.add_argument("--no-isolate", action="store_true",
                   help="run the versions in this process (default: a forked child each in the emulator; on a "
                        "GPU one spawned child, replaced after a version fails)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    p.add_argument("--no-analyze", action="store_true",
                   help="emulator: skip the memory-traffic metrics and roofline model recorded per version")
    p.add_argument("--gpu", default=None, metavar="NAME",
                   help=f"emulator: the GPU the recorded roofline model predicts for (default {DEFAULT_GPU}; "
                        f"{', '.join(name for name in GPUS if name != DEFAULT_GPU)}); keep it the same in a "
                        "before/after pair")
    p.add_argument("-v", "--verbose", action="store_true", help="the full per-block report of every version")
    return p


def _compare_main(argv) -> int:
    p = argparse.ArgumentParser(prog="python -m llmcupy.bench compare",
                                description="Per op/version deltas between two benchmark records: best ms "
                                            "before and after (at the best block size of each), speed-up, "
                                            "correctness changes, and which ops' kernel files or launchers "
                                            "differ between the runs. Emulator records hold no times: between "
                                            "two of them, each version's verdict and the memory-traffic counts "
                                            "and roofline model's time before and after (a model, not a "
                                            "measurement). Exit 1 when a version that passed before fails "
                                            "after; 2 for an unreadable file or an emulator record against a "
                                            "GPU one.")
    p.add_argument("before", help="the record before the change: a bench results JSON (or a python -m "
                                  "llmcupy.kernel --json list)")
    p.add_argument("after", help="the record after the change, of the same kind")
    p.add_argument("--blocks", action="store_true", help="also every block size")
    args = p.parse_args(argv)
    try:
        before, after = load(args.before), load(args.after)
    except (OSError, ValueError) as exc:
        from ._cli import fail

        return fail(exc)
    kinds = {path: rec.get("backend") for path, rec in ((args.before, before), (args.after, after))}
    if {"sim", "cuda"} <= set(kinds.values()):
        which = ", ".join(f"{p} is {'an emulator' if b == 'sim' else 'a GPU'} run" for p, b in kinds.items())
        print(f"error: will not compare an emulator record with a GPU record ({which}); the emulator's results "
              "are correctness only. Compare two GPU runs, or two emulator runs", file=sys.stderr)
        return 2
    text, regressed = compare(before, after, blocks=args.blocks)
    print(text)
    return 1 if regressed else 0


def _defaults_main(argv) -> int:
    from . import defaults

    p = argparse.ArgumentParser(prog="python -m llmcupy.bench defaults",
                                description="Write the trainer's kernel defaults: " + defaults.RULE + ".")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="the recorded runs (default: bench/results of this checkout, beside the bench/defaults.json "
                        "it writes, wherever the command runs from)")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="where to write (default: bench/defaults.json of this checkout, the file the trainer reads; "
                        "LLMCUPY_DEFAULTS names another)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 0 when the file is what the results give, 1 when it differs")
    args = p.parse_args(argv)
    out = Path(args.out) if args.out else defaults.default_path()
    from ._cli import BadPath, check_output_file, fail

    given = args.results is not None
    # the default is the checkout's folder, not bench/results of the working folder: the file written
    # is the checkout's, and from another folder the runs were not found ("no GPU run is recorded yet")
    args.results = args.results if given else str(defaults.results_dir())
    if not args.check and not os.path.isdir(args.results):
        # a typo, or no GPU run yet: deriving from nothing would write a file with no GPU in it over
        # the measured defaults (--check writes nothing: a fresh clone, whose bench/results holds no
        # GPU run yet, checks against none)
        if not given:   # most often a fresh clone: no GPU run has been recorded at all
            return fail(ValueError(f"no GPU run is recorded yet: {args.results} does not exist (python -m "
                                   "llmcupy.bench --trainer-shapes on a GPU makes it, or give --results DIR); "
                                   f"{defaults.display_path(out)} is left as it is"))
        return fail(ValueError(f"--results {args.results}: no such folder; give the folder of the recorded "
                               "--trainer-shapes runs (default: bench/results of this checkout)"))
    if not args.check:
        try:
            check_output_file(out, "--out")   # a folder or special file: say so, not "unreadable defaults"
        except BadPath as exc:
            return fail(exc)
    try:
        doc = defaults.derive(args.results)
        current = defaults.load(out) if out.exists() else None
    except defaults.DefaultsError as exc:
        return fail(exc)
    print(defaults.format_doc(doc, args.results))
    if args.check:
        same = current is not None and current.get("devices") == doc["devices"]
        print(f"{out}: {'up to date' if same else 'out of date: run python -m llmcupy.bench defaults'}")
        return 0 if same else 1
    measured = sorted((current or {}).get("devices") or {})
    if measured and not doc["devices"]:
        # a folder with no run in it (the wrong one, or another checkout's) would erase what was measured
        return fail(ValueError(f"{args.results} holds no --trainer-shapes GPU run, but {defaults.display_path(out)} "
                               f"holds the measured defaults of {', '.join(measured)}; give --results the folder "
                               "of their runs (or delete the file to write one naming no GPU); it is left as it is"))
    dropped = [name for name in measured if name not in doc["devices"]]
    if dropped:   # deliberate (their runs were removed) or the wrong folder: either way, say so
        print(f"note: the defaults of {', '.join(dropped)} are dropped: {args.results} holds no --trainer-shapes run "
              "of theirs", file=sys.stderr)
    print(f"defaults: {defaults.write(doc, out)}")
    return 0


def _no_matplotlib(exc: ImportError) -> str:
    return (f"error: --plot needs matplotlib ({exc}); pip install matplotlib (a dependency of llmcupy: "
            "reinstall the package)")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "compare":
        return _compare_main(argv[1:])
    if argv and argv[0] == "defaults":
        return _defaults_main(argv[1:])
    args = _parser().parse_args(argv)
    command = "python -m llmcupy.bench" + ("" if not argv else " " + shlex.join(argv))
    from .ops import OpError
    from .runtime import backend as _backend

    if args.list_results:
        # without --out: both folders a run writes to by default (GPU runs, and emulator runs kept apart)
        folders = [args.out] if args.out else [shown_path(results_folder(b)) for b in ("cuda", "sim")]
        print("\n".join(list_results(d) for d in folders))
        return 0
    if args.plot:
        # before the (possibly hours-long) run whose plot it is
        from ._cli import BadPath

        try:
            check_plot_path(args.plot)
        except ImportError as exc:
            print(_no_matplotlib(exc), file=sys.stderr)
            return 2
        except BadPath as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if args.from_file:
        try:
            record = load(args.from_file)
            if args.ops:
                plan_for(args.ops)   # a misspelt op: the choices, not an empty listing
        except (OSError, ValueError) as exc:
            from ._cli import fail

            return fail(exc)   # names the file: "x.json: no such file", "x.json is a folder; give a file"
        if args.ops and not any(entry["op"] in args.ops for entry in record["results"]):
            print(f"error: {args.from_file} has no results of {', '.join(args.ops)}; it has "
                  f"{', '.join(dict.fromkeys(e['op'] for e in record['results'])) or 'none'}", file=sys.stderr)
            return 2
        for entry in record["results"]:
            if not args.ops or entry["op"] in args.ops:
                print(format_entry(entry))
        if args.plot:
            try:
                plot_results(record, args.plot, ops=args.ops)
            except ImportError as exc:
                print(_no_matplotlib(exc), file=sys.stderr)
                return 2
            except ValueError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            print(f"plot: {args.plot}")
        return 0
    try:
        if args.backend:
            _backend.set_backend(args.backend)
        plan_for(args.ops)  # unknown op: exit 2 before anything runs
        if args.trainer_shapes and args.ops:
            from .defaults import trainer_sizes

            others = [n for n in args.ops if n not in trainer_sizes()]
            if others:
                raise OpError(f"--trainer-shapes: {', '.join(others)} is not an op of the training step; those "
                              f"are: {', '.join(trainer_sizes())}")
        backend = _backend.get_backend()
        if backend == "sim":
            from .sim.launcher import check_environment

            check_environment()   # a bad LLMCUPY_SIM_* / LLMCUPY_CACHE_DIR: one line now, not per version
    except (OpError, _backend.BackendError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.trainer_shapes and backend != "cuda":
        print("error: --trainer-shapes times the step's ops at GPT-2 124M's sizes to pick the trainer's defaults; "
              f"the {backend} backend records no times (and would take hours at those sizes): run it on a GPU",
              file=sys.stderr)
        return 2
    if args.trainer_shapes and args.small:
        print("error: --trainer-shapes and --small ask for different sizes; give one", file=sys.stderr)
        return 2
    if args.gpu and (args.no_analyze or backend == "cuda"):
        # the model is the only thing --gpu changes: taken silently, it would read as recorded
        without = ("--no-analyze leaves out; drop one of them" if args.no_analyze else
                   f"only an emulator run records (this {backend} run measures times); drop --gpu")
        print(f"error: --gpu {args.gpu} names the GPU of the roofline model, which {without}", file=sys.stderr)
        return 2
    if backend != "cuda":
        print(f"note: backend {backend}: {NO_TIMING_REASON}.", flush=True)
    if args.gpu:
        from . import analyze as _analyze

        try:
            _analyze.gpu(args.gpu)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    out_dir = args.out or shown_path(results_folder(backend))
    if not args.no_save:
        from ._cli import BadPath, check_output_folder

        try:
            check_output_folder(out_dir, "--out")
        except BadPath as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    saver = None if args.no_save else _SaveAsYouGo(out_dir)
    try:
        record = run(args.ops, small=args.small, seed=args.seed, repeat=args.repeat, analyze=not args.no_analyze,
                     gpu=args.gpu,
                     isolate=False if args.no_isolate else None, command=command, progress=not args.no_progress,
                     verbose=args.verbose, trainer=args.trainer_shapes, on_entry=saver,
                     tf32=None if args.tf32 is None else bool(args.tf32))
    except KeyboardInterrupt:
        if saver is not None and saver.record is not None:
            saver(saver.record)   # a version may have finished between its entry and the save
        kept = (f"; the versions that finished are in {saver.path} (marked partial)"
                if saver is not None and saver.path is not None else "")
        print(f"\ninterrupted{kept}", file=sys.stderr)
        return 130
    c = record["summary"]
    print(f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped")
    if saver is not None:
        path = saver.final(record)
        print(f"results: {path}")
        if args.trainer_shapes:
            print("the trainer's defaults follow it once you run: python -m llmcupy.bench defaults"
                  + (f" --results {args.out}" if args.out else ""))
    if args.plot:
        try:
            plot_results(record, args.plot)
        except ImportError as exc:
            print(_no_matplotlib(exc), file=sys.stderr)
            return 2
        print(f"plot: {args.plot}")
    return 1 if c["failed"] else 0


if __name__ == "__main__":
    from llmcupy._cli import run_main

    sys.exit(run_main(main))
