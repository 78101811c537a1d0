"""python -m llmcupy.startup: the cold and warm start time of a training run, recorded as JSON.

    python -m llmcupy.startup                        # GPT-2 124M (gpt2_124M.bin), B=4, T=1024
    python -m llmcupy.startup --init d12 -b 4 -t 1024 --cuda-graph

Runs ``python -m llmcupy.train --benchmark --steps 1 --warmup 0`` with the given trainer flags
twice, each in a fresh process, and measures the wall-clock time to its exit:

* **cold**: with empty kernel caches (CuPy's ``CUPY_CACHE_DIR`` and the emulator's
  ``LLMCUPY_CACHE_DIR`` point at a new temporary folder), so every kernel file of the step is
  compiled (NVRTC on a GPU, g++ in the emulator);
* **warm**: again with the caches the cold run filled.

The difference is what compiling costs at the first start. The record (device, versions, commit,
date, command, both times and both runs' output tails) goes to ``bench/results/startup-*.json``
(``--out``); in the emulator the times are the CPU emulator's and the record says so.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = [sys.executable, "-m", "llmcupy.train", "--benchmark", "--steps", "1", "--warmup", "0"]


def _run(argv: list[str], env: dict) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "returncode": proc.returncode, "tail": (proc.stdout + proc.stderr)[-2000:]}


def measure(train_flags: list[str], run=_run) -> dict:
    """Cold then warm wall-clock seconds of one benchmark step of ``python -m llmcupy.train``."""
    argv = TRAIN + list(train_flags)
    with tempfile.TemporaryDirectory(prefix="llmcupy-startup-") as cache:
        env = dict(os.environ, CUPY_CACHE_DIR=os.path.join(cache, "cupy"), LLMCUPY_CACHE_DIR=os.path.join(cache, "sim"))
        cold = run(argv, env)
        warm = run(argv, env)
    return {"command": shlex.join(argv[1:]), "cold": cold, "warm": warm}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m llmcupy.startup", description=__doc__.split("\n\n")[0],
                                epilog="Other flags go to python -m llmcupy.train.")
    p.add_argument("--out", default=os.path.join("bench", "results"), help="folder of the JSON record")
    args, train_flags = p.parse_known_args(argv)
    from . import _cli, bench
    from .runtime import backend as _backend

    try:
        backend = _backend.get_backend()
    except _backend.BackendError as exc:
        return _cli.fail(exc)
    result = measure(train_flags)
    for what in ("cold", "warm"):
        r = result[what]
        print(f"{what} start: {r['seconds']:.2f} s (exit {r['returncode']})")
        if r["returncode"] != 0:
            print(r["tail"], file=sys.stderr)
    ok = result["cold"]["returncode"] == 0 and result["warm"]["returncode"] == 0
    now = bench._utc_now()
    record = {"schema": "llmcupy.startup/1", "backend": backend, "device": _backend.device_name(),
              "date": now.isoformat(), **bench.git_commit(), "versions": bench._software_versions(), **result,
              "compile_seconds": result["cold"]["seconds"] - result["warm"]["seconds"]}
    if backend != "cuda":
        record["note"] = "CPU emulator: g++ builds and emulated steps, not a GPU's start time"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"startup-{bench._slug(record['device'])}-{now.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
