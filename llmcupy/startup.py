"""python -m llmcupy.startup: the cold and warm start time of a training run, recorded as JSON.

    python -m llmcupy.startup                        # GPT-2 124M (gpt2_124M.bin), B=4, T=1024
    python -m llmcupy.startup --init d12 -b 4 -t 1024 --cuda-graph

Runs ``python -m llmcupy.train --benchmark --steps 1 --warmup 0`` with the given trainer flags
twice, each in a fresh process, and measures the wall-clock time to its exit:

* **cold**: with empty kernel caches (CuPy's ``CUPY_CACHE_DIR`` and the emulator's
  ``LLMCUPY_CACHE_DIR`` point at a new temporary folder), so every kernel file of the step is
  compiled (NVRTC on a GPU, g++ in the emulator);
* **warm**: again with the caches the cold run filled.

The difference is what compiling costs at the first start. The record (``llmcupy.startup/1``) carries
the provenance of the other records in bench/results (``schema``, ``date`` in UTC, ``command`` as typed,
``backend``, ``device``, ``host``, ``git``, ``software``), then ``train_command`` (the trainer's command
line it timed), ``cold`` and ``warm`` (``seconds``, ``returncode`` and the output's ``tail``) and
``compile_seconds``. It goes to ``bench/results/startup-*.json`` (``--out``); in the emulator the times
are the CPU emulator's, the record says so and goes to the git-ignored ``bench/results/sim/``, as
``python -m llmcupy.bench``'s emulator runs do.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EMULATOR_NOTE = "CPU emulator: g++ builds and emulated steps, not a GPU's start time"
TRAIN = [sys.executable, "-m", "llmcupy.train", "--benchmark", "--steps", "1", "--warmup", "0"]


def _run(argv: list[str], env: dict) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "returncode": proc.returncode, "tail": (proc.stdout + proc.stderr)[-2000:]}


def measure(train_flags: list[str], run=None) -> dict:
    """Cold then warm wall-clock seconds of one benchmark step of ``python -m llmcupy.train``."""
    run = run or _run
    argv = TRAIN + list(train_flags)
    with tempfile.TemporaryDirectory(prefix="llmcupy-startup-") as cache:
        env = dict(os.environ, CUPY_CACHE_DIR=os.path.join(cache, "cupy"), LLMCUPY_CACHE_DIR=os.path.join(cache, "sim"))
        cold = run(argv, env)
        # a run that failed measured no start: the warm run would only fail again
        warm = run(argv, env) if cold["returncode"] == 0 else None
    return {"command": "python " + shlex.join(argv[1:]), "cold": cold, "warm": warm}


def check_train_flags(train_flags: list[str]) -> int | None:
    """The trainer's parser on the flags, here, once: a typo is one usage message and exit 2, not two
    failed runs (each printing its usage). Returns the exit code of a refusal, or None."""
    from .train import build_parser

    parser = build_parser()
    parser.prog = "python -m llmcupy.startup (trainer flags)"
    try:
        parser.parse_args(TRAIN[3:] + list(train_flags))
    except SystemExit as exc:   # argparse has printed the usage and the error
        return exc.code
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m llmcupy.startup", description=__doc__.split("\n\n")[0],
                                epilog="Other flags go to python -m llmcupy.train.")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="folder of the JSON record (default: this checkout's bench/results on a GPU, bench/results/sim "
                        "in the emulator, whatever the working folder)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args, train_flags = p.parse_known_args(argv)
    from . import _cli, bench
    from .runtime import backend as _backend

    try:
        backend = _backend.get_backend()
        # the emulator's CPU times are no GPU evidence: kept apart, git-ignored, as bench's emulator runs
        out = Path(args.out or bench.shown_path(bench.results_folder(backend)))
        _cli.check_output_folder(out, "--out")   # before the two runs, not a traceback after them
    except (_backend.BackendError, _cli.BadPath) as exc:
        return _cli.fail(exc)
    refused = check_train_flags(train_flags)
    if refused is not None:
        return refused
    result = measure(train_flags)
    if backend != "cuda":   # before the times, which would otherwise read as a GPU's
        print(f"note: {EMULATOR_NOTE}")
    for what in ("cold", "warm"):
        r = result[what]
        if r is None:
            continue
        print(f"{what} start: {r['seconds']:.2f} s (exit {r['returncode']})")
        if r["returncode"] != 0:
            # the trainer's own error (a missing model, a shape a version refuses...): its exit code,
            # and no record, since a failed run measured no start time
            print(r["tail"], file=sys.stderr)
            print(f"error: the {what} run of the trainer failed (exit {r['returncode']}); nothing recorded",
                  file=sys.stderr)
            return r["returncode"]
    now = bench._utc_now()
    # the provenance in the shape of the sweeps' and launchbench's, so one reader takes it from any record
    record = {"schema": "llmcupy.startup/1", "date": now.isoformat().replace("+00:00", "Z"),
              "command": "python -m llmcupy.startup" + ("" if not argv else " " + shlex.join(argv)),
              "backend": backend, "device": _backend.device_name(), "host": platform.node(),
              "git": bench.git_commit(), "software": bench._software_versions(),
              "train_command": result["command"], "cold": result["cold"], "warm": result["warm"],
              "compile_seconds": result["cold"]["seconds"] - result["warm"]["seconds"]}
    if backend != "cuda":
        record["note"] = EMULATOR_NOTE
    from .fileio import atomic_write

    path = out / f"startup-{bench._slug(record['device'])}-{now.strftime('%Y%m%dT%H%M%SZ')}.json"
    with atomic_write(path) as f:   # bench defaults reads the folder: never half a record there
        f.write((json.dumps(record, indent=2) + "\n").encode())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    from llmcupy._cli import run_main

    sys.exit(run_main(main))
