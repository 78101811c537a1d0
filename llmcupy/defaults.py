"""The trainer's kernel defaults from GPU measurements: ``bench/defaults.json``.

The catalogue's default version of each op (``op.default_version``, the ``*`` of ``--list``) is
llm.c's choice: its fastest version per file by its own account, or the version its FP32 trainer
uses. Measurements replace those choices per GPU:

1. ``python -m llmcupy.bench --trainer-shapes`` (on a GPU) validates and times every version of
   every op of the training step at the trainer's shapes (GPT-2 124M, B=4, T=1024; see
   :func:`trainer_sizes`) and records the run in ``bench/results/``. Its FP32 GEMMs run as the trainer's
   do: with TF32 on (``TRAINER_TF32``, train.py's ``--tf32`` default; ``bench --tf32 0`` measures without),
   so a cuBLAS-backed version is timed at the speed the trainer gets from it.
2. ``python -m llmcupy.bench defaults`` takes the newest such run per device and writes, per op,
   the fastest version that passed and is deterministic (the trainer's rule: two runs print the
   same losses), with its best block size, to ``bench/defaults.json`` (committed, named by GPU).
   Only runs measured with the trainer's TF32 setting count (a run's ``"tf32"``; older records without it
   ran plain FP32 GEMMs): a run at the other setting times the cuBLAS versions at another speed, so
   it is left out, and said so.
3. ``python -m llmcupy.train`` on a GPU named in that file runs those versions unless a flag
   chooses another (``--matmul-kernel N``, ``--kernel OP=N``, ``--kernel-defaults catalogue``);
   on any other GPU, and in the emulator, the catalogue's defaults. It prints which applies.
"""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

from .ops import OpError

SCHEMA = "llmcupy.defaults/1"
TRAINER_MODEL, TRAINER_B, TRAINER_T = "d12", 4, 1024   # GPT-2 124M as train_gpt2fp32cu runs it
# train.py's --tf32 default (llm.c's: on). The cuBLAS-backed versions are several times faster with TF32
# on an sm_80+ GPU, so the defaults are measured, and chosen, at this setting (tests check the two agree).
TRAINER_TF32 = True
RULE = ("per op of the training step: the fastest version that passed validation and is deterministic, at the "
        f"trainer's shapes (GPT-2 124M, B={TRAINER_B}, T={TRAINER_T}) and TF32 setting "
        f"({'on' if TRAINER_TF32 else 'off'}), from the newest `python -m llmcupy.bench --trainer-shapes` run "
        "of each GPU in bench/results/")


class DefaultsError(OpError):
    """An unreadable or malformed defaults file (the message names it and what to do). An OpError, so
    every CLI that reports bad kernel choices in one line (exit 2) reports this one too."""


def repo_dir() -> Path:
    return Path(__file__).resolve().parent.parent


def checkout_bench() -> Path:
    """``bench/`` of this checkout, or of the working folder for a package installed without its
    checkout. A checkout is told by its ``pyproject.toml`` beside ``bench/``: a ``bench`` folder alone
    beside an installed package may be another distribution's (site-packages holds whatever top-level
    names its packages install)."""
    root = repo_dir()
    if (root / "pyproject.toml").is_file() and (root / "bench").is_dir():
        return root / "bench"
    return Path("bench")


def default_path() -> Path:
    """``bench/defaults.json`` of this checkout (:func:`checkout_bench`; ``LLMCUPY_DEFAULTS`` names
    another file)."""
    return Path(os.environ.get("LLMCUPY_DEFAULTS") or checkout_bench() / "defaults.json")


def results_dir() -> Path:
    """``bench/results`` of this checkout, wherever a command runs from: where ``bench`` and ``startup``
    record their runs by default, which ``bench defaults`` (beside the ``bench/defaults.json`` it writes),
    ``bench --list-results`` and the kernel CLI's rank correlation read. A package installed without its
    checkout has none: there it is ``bench/results`` of the working folder (:func:`checkout_bench`)."""
    return checkout_bench() / "results"


def display_path(path=None) -> str:
    """The defaults file as a message names it: relative to the checkout when inside it."""
    path = Path(path) if path is not None else default_path()
    try:
        return path.resolve().relative_to(repo_dir()).as_posix()
    except ValueError:
        return str(path)


def trainer_sizes(B: int = TRAINER_B, T: int = TRAINER_T, model: str = TRAINER_MODEL) -> dict:
    """Each training-step op's sizes (its ``op.sizes`` names) as the trainer runs it.

    One shape per op: the matmuls at the MLP up-projection (C -> 4C, the largest of the step's
    GEMMs but the classifier's), adamw over all the parameters.
    """
    from .config import GPT2Config, num_parameters

    cfg = GPT2Config.preset(model)
    C, NH, V, Vp = cfg.channels, cfg.num_heads, cfg.vocab_size, cfg.padded_vocab_size
    bt = {"B": B, "T": T}
    rows = {**bt, "C": C}
    attention = {**bt, "C": C, "NH": NH}
    mlp = {**bt, "C": C, "OC": 4 * C}
    return {
        "encoder_forward": {**rows, "V": V}, "encoder_backward": {**rows, "V": V},
        "layernorm_forward": rows, "layernorm_backward": rows, "residual_forward": rows,
        "gelu_forward": rows, "gelu_backward": rows, "fused_residual_forward": rows,
        "matmul_forward": mlp, "matmul_backward": mlp, "matmul_gelu_forward": mlp,
        "matmul_backward_bias": {**bt, "OC": 4 * C},
        "attention_forward": attention, "attention_backward": attention,
        "flash_attention_forward": attention, "flash_attention_backward": attention,
        "classifier_fused": {**bt, "V": V, "P": Vp},
        "adamw": {"P": num_parameters(cfg)},
    }


# -- deriving the defaults from bench/results --------------------------------------------------


def record_tf32(record: dict) -> bool:
    """The TF32 setting a benchmark run asked for; records from before bench recorded it ran plain FP32."""
    return bool(record.get("tf32", False))


def _newest_per_device(results_dir, ignored: list | None = None) -> dict:
    """{device: (path, record)}: the newest timed GPU run at the trainer's shapes and TF32 setting per
    device. Runs at the trainer's shapes measured with the other TF32 setting, and the other tools'
    records a GPU session leaves beside the runs (start-up times, side by side), are appended to
    ``ignored`` ("path: why") instead."""
    from ._cli import message
    from .bench import OtherRecord, load

    newest: dict = {}
    for path in sorted(glob.glob(os.path.join(str(results_dir), "*.json"))):
        try:
            record = load(path)
        except OtherRecord as exc:
            if ignored is not None:
                ignored.append(f"{path}: not a benchmark run ({'schema ' + str(exc.schema) if exc.schema else 'no schema'})")
            continue
        except (OSError, ValueError) as exc:   # json.JSONDecodeError is a ValueError; both name the file
            raise DefaultsError(f"{message(exc)}; move it out of {results_dir} or fix it") from None
        if record.get("backend") != "cuda" or not record.get("timed") or record.get("sizes") != "trainer":
            continue
        if record_tf32(record) != TRAINER_TF32:
            if ignored is not None:
                ignored.append(f"{path}: measured with TF32 {'on' if not TRAINER_TF32 else 'off'}, the trainer "
                               f"runs with it {'on' if TRAINER_TF32 else 'off'} (bench --trainer-shapes --tf32 "
                               f"{int(TRAINER_TF32)})")
            continue
        device = record.get("device") or "unknown GPU"
        if device not in newest or str(record.get("date", "")) > str(newest[device][1].get("date", "")):
            newest[device] = (path, record)
    return newest


def pick(record: dict) -> dict:
    """{op: choice} of one run: per op, its fastest passing deterministic version at the trainer's shapes."""
    from . import ops as registry

    wanted = trainer_sizes()
    best: dict = {}
    timed: dict = {}
    results = record.get("results", [])
    # a run stopped early (bench saves "partial" records as it goes) ran its ops one after the other:
    # those before the last are complete, the last may lack versions, so it has no fastest yet
    unfinished = results[-1].get("op") if record.get("partial") and results else None
    for entry in results:
        op_name, number = entry.get("op"), entry.get("version")
        if op_name == unfinished:
            continue
        sizes = entry.get("sizes") or {}
        if op_name not in wanted or op_name not in registry.names() or any(
                sizes.get(k) != v for k, v in wanted[op_name].items()):
            continue   # another op, or not timed at the trainer's shapes
        op = registry.get(op_name)
        v = op.versions.get(int(number)) if number is not None else None
        ms = (entry.get("best") or {}).get("ms")
        if v is None or entry.get("ok") is not True or ms is None:
            continue
        timed[(op_name, v.number)] = ms
        if not v.deterministic or not v.available:
            continue
        if op_name not in best or ms < best[op_name]["ms"]:
            best[op_name] = {"version": v.number, "block_size": entry["best"].get("block_size"), "ms": ms}
    for op_name, choice in best.items():
        default = registry.get(op_name).default_version
        choice["catalogue_default"] = default
        choice["catalogue_default_ms"] = timed.get((op_name, default))
    return dict(sorted(best.items()))


def derive(results_dir) -> dict:
    """The defaults document from the runs under ``results_dir`` (no runs: no devices).

    ``ignored`` lists the runs left out for their TF32 setting and the other tools' records (printed,
    not written to the file)."""
    devices = {}
    ignored: list = []
    for device, (path, record) in sorted(_newest_per_device(results_dir, ignored).items()):
        ops = pick(record)
        if not ops:
            continue
        try:
            source = Path(path).resolve().relative_to(repo_dir()).as_posix()
        except ValueError:   # results outside the checkout
            source = Path(path).name
        devices[device] = {"source": source, "date": record.get("date"), "tf32": record_tf32(record),
                           "commit": (record.get("git") or {}).get("commit", "unknown"), "ops": ops}
    doc = {"schema": SCHEMA, "written_by": "python -m llmcupy.bench defaults", "rule": RULE, "devices": devices}
    if ignored:
        doc["ignored"] = ignored
    return doc


def write(doc: dict, path) -> Path:
    from .fileio import atomic_write

    path = Path(path)
    doc = {k: v for k, v in doc.items() if k != "ignored"}   # a note for the console, not part of the file
    with atomic_write(path) as f:   # a reader never sees half a file
        f.write((json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())
    return path


def format_doc(doc: dict, results_dir="bench/results") -> str:
    ignored = [f"ignored {line}" for line in doc.get("ignored", ())]
    if not doc["devices"]:
        return "\n".join(ignored + [
            "no GPU has been measured at the trainer's shapes (no `python -m llmcupy.bench --trainer-shapes` "
            f"run in {os.path.join(str(results_dir), '')}): the trainer uses the catalogue's defaults, llm.c's "
            "choices"])
    lines = ignored
    for device, d in doc["devices"].items():
        tf32 = "" if "tf32" not in d else f", TF32 {'on' if d['tf32'] else 'off'}"
        lines.append(f"{device}: {d['source']} ({d['date']}, commit {str(d['commit'])[:10]}{tf32})")
        for op_name, c in d["ops"].items():
            was = c.get("catalogue_default_ms")
            note = ("= catalogue default" if c["version"] == c["catalogue_default"]
                    else f"catalogue default v{c['catalogue_default']}"
                    + (f" {was:.4f} ms, {was / c['ms']:.2f}x slower" if was else " (not timed)"))
            block = "" if c.get("block_size") is None else f" @ {c['block_size']}"
            lines.append(f"  {op_name:<26} v{c['version']:<3}{block:<7} {c['ms']:.4f} ms  ({note})")
    return "\n".join(lines)


# -- reading them (the trainer, --list) ---------------------------------------------------------


def load(path=None) -> dict:
    """The defaults document; a missing file is one with no measured device."""
    path = Path(path) if path is not None else default_path()
    if not path.exists():
        return {"schema": SCHEMA, "devices": {}, "missing": str(path)}
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DefaultsError(f"{path}: unreadable kernel defaults ({exc}); regenerate it with "
                            "python -m llmcupy.bench defaults") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("devices"), dict):
        raise DefaultsError(f"{path}: not a kernel defaults file (schema {SCHEMA}); regenerate it with "
                            "python -m llmcupy.bench defaults")
    for device, d in doc["devices"].items():
        ops = d.get("ops") if isinstance(d, dict) else None
        if not isinstance(ops, dict) or not all(isinstance(c, dict) and isinstance(c.get("version"), int)
                                                for c in ops.values()):
            raise DefaultsError(f"{path}: the entry of {device!r} has no per-op versions; regenerate it with "
                                "python -m llmcupy.bench defaults")
    return doc


def for_device(device: str, path=None) -> dict | None:
    """The measured entry of ``device`` (``source``, ``date``, ``commit``, ``ops``), or None."""
    return load(path)["devices"].get(device)


def provenance(path=None) -> str:
    """A paragraph for ``--list`` and the README: which defaults are measured, on which GPU."""
    doc = load(path)
    where = display_path(path)
    if not doc["devices"]:
        state = ("is not there (a package installed without its source checkout)" if "missing" in doc else
                 "names no GPU (no `python -m llmcupy.bench --trainer-shapes` run has been recorded)")
        from . import ops as registry

        own = [n for n in registry.names() if registry.get(n).default_note]
        exceptions = (f" -- except {', '.join(own)}, whose --list says why" if own else "")
        return (f"No default is measured yet: {where} {state}, so every * is the catalogue's default, llm.c's "
                f"choice (its fastest version per file by its own account, or the version its FP32 trainer uses)"
                f"{exceptions}. A rung past llm.c "
                "(matmul_forward 5) becomes the trainer's default only where it is measured fastest: select it "
                "with --matmul-kernel 5; the fusions (matmul_gelu_forward, fused_residual_forward, "
                "flash_attention_*) run with --fused, at their measured version where there is one.")
    lines = [f"Measured defaults in {where} (the trainer uses them on that GPU; elsewhere the * versions, llm.c's "
             "choices):"]
    from . import ops as registry
    from .model import STEP_OPS

    for device, d in doc["devices"].items():
        chosen = ", ".join(f"{op} {c['version']}" for op, c in d["ops"].items())
        unmeasured = [op for op in STEP_OPS if op not in d["ops"] and op in registry.names()]
        lines.append(f"  {device} ({d.get('date')}, {d.get('source')}): {chosen}")
        if unmeasured:
            lines.append(f"    not measured there (llm.c's choice): {', '.join(unmeasured)}")
    return "\n".join(lines)
