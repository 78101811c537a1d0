#!/usr/bin/env bash
# The GPU checks a session runs when it is lent a GPU, in four device calls of under 10 minutes,
# each writing its logs and JSON records to $OUT (copy the records into bench/results/, run
# `python -m llmcupy.bench defaults` to update bench/defaults.json from them, and commit):
#
#   bash bench/gpu_session.sh wheels   # HERE, before the first call (needs PyPI): the packages the
#                                      # GPU image lacks, as Python 3.12 wheels in .whl/ (git-ignored)
#   bash bench/gpu_session.sh check    # install; pytest -m gpu; kernel --all --json
#   bash bench/gpu_session.sh catalogue  # kernel --all --json alone (if check's was cut short)
#   bash bench/gpu_session.sh bench    # bench sweep of every version at the ops' sizes
#   bash bench/gpu_session.sh step     # the step's ops at the trainer's shapes (for the defaults);
#                                      # profile and start-up times of GPT-2 124M
#   bash bench/gpu_session.sh side     # llm.c's FP32 trainer and PyTorch side by side (.shared/gpu),
#                                      # recorded as results/side_by_side-<date>.json
#
# Every device call carries the wheels: `carry: [".whl"]` (and ".shared" for `side`). The GPU image
# has CuPy, cuda-bindings and the CUDA libraries but not nvmath-python, whose cuBLAS / cuBLASLt
# bindings the cuda backend calls (llmcupy/runtime/blas.py); the wheels install under /tmp/site.
# Each stage has its own time limit, so a slow or hung stage costs its limit, not the whole call,
# and what finished before it still comes back. A stage's limit is also cut to what is left of the
# call's budget (CALL_BUDGET: 570 s of the device call's 600), less the 20 s a stage may take after
# its SIGINT, so the last stage of a call is stopped by its own timeout (logs, summaries and JSON
# written) rather than by the device call's. A device call brings back at most 8 files from $OUT
# (16 MiB each) and leaves the rest behind, so when a stage leaves more (side's dozen logs), the logs
# go into one logs.tar.gz and the JSON records stay plain files. Run from the project's root.
set -uo pipefail
OUT=${OUT:-/tmp/llmcupy_gpu_session}; mkdir -p "$OUT/results"
export PYTHONUNBUFFERED=1 LLMCUPY_BACKEND=${LLMCUPY_BACKEND:-cuda}
PY=${PYTHON:-python3}
CALL_BUDGET=${CALL_BUDGET:-570}   # seconds of the device call (600 s at most) the stages may use
KILL_AFTER=20                     # a stage's SIGKILL comes this long after its SIGINT
MAX_FILES=8                       # the files a device call brings back from $OUT

stage() {  # stage NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.log, say how it ended
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  # the limit, cut to what is left of the call's budget ($SECONDS: time since this script started)
  local left=$((CALL_BUDGET - SECONDS - KILL_AFTER))
  if ((left < limit)); then
    if ((left < 10)); then
      echo "$name: skipped, $((CALL_BUDGET - SECONDS)) s left of the call's budget of $CALL_BUDGET s" |
        tee -a "$OUT/stages.txt"
      return
    fi
    echo "$name: limit cut from $limit s to the $left s left of the call's budget" | tee -a "$OUT/stages.txt"
    limit=$left
  fi
  # SIGINT first: Python stops as at Ctrl-C (pytest still writes its summary and junit file; kernel
  # and bench have saved each version as they went), then SIGKILL later if it is still running
  timeout --signal=INT --kill-after=$KILL_AFTER "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc after $((SECONDS - t0)) s (limit $limit s; log $name.log)" | tee -a "$OUT/stages.txt"
  tail -n 4 "$OUT/$name.log"
}

# The packages the GPU image lacks (see the header); the version the emulator-side tests run against.
NVMATH=nvmath-python==1.0.0
# nvmath-python's own needs, carried in case the image's copies are too old for it: installed only
# when nvmath does not import with the image's (they would shadow the image's copies otherwise).
NVMATH_DEPS=(cuda-core cuda-pathfinder)
SITE=/tmp/site
# pyproject.toml's license is an SPDX string, which setuptools reads from version 77 on; an image
# with an older one builds the project in pip's isolated build from this carried wheel instead
SETUPTOOLS='setuptools>=77'

download_wheels() {  # here: Python 3.12 manylinux wheels for the GPU image, into .whl/
    local exclude; exclude=$(git rev-parse --git-path info/exclude) && mkdir -p "$(dirname "$exclude")" &&
    { grep -qx '/.whl/' "$exclude" 2>/dev/null || echo /.whl/ >>"$exclude"; }
    rm -rf .whl && mkdir -p .whl/deps
    local platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
                     --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
                     --platform manylinux2014_x86_64)
    local opts=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}")
    python3 -m pip download --quiet "${opts[@]}" -d .whl "$NVMATH" &&
    python3 -m pip download --quiet "${opts[@]}" -d .whl/deps "${NVMATH_DEPS[@]}" &&
    python3 -m pip download --quiet "${opts[@]}" -d .whl/build "$SETUPTOOLS" || exit 1
    ls -l .whl .whl/deps .whl/build
}

install() {  # on the GPU machine: the project (editable) and the carried wheels
    if $PY -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)" 2>/dev/null; then
        stage install 60 $PY -m pip install --no-deps --no-build-isolation -e .
    else   # too old or absent: the carried wheel (no index on the device)
        stage install 60 $PY -m pip install --no-deps --no-index --find-links .whl/build -e .
    fi
    if ! $PY -c "import nvmath.bindings.cublasLt" 2>/dev/null; then
        if ! ls .whl/*.whl >/dev/null 2>&1; then
            echo "nvmath-python is missing and no wheels were carried: run 'bash bench/gpu_session.sh wheels'" \
                 "here and name .whl in the call's carry" | tee -a "$OUT/stages.txt"
            return
        fi
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
        export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
        if ! $PY -c "import nvmath.bindings.cublasLt" >>"$OUT/install.log" 2>&1; then
            $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/deps/*.whl
        fi
    fi
    $PY - >>"$OUT/stages.txt" 2>&1 <<'PYEOF'
import importlib.metadata as md
for name in ("nvmath-python", "cuda-core", "cuda-pathfinder", "cuda-bindings", "cupy-cuda13x", "cupy-cuda12x"):
    try:
        print(f"{name} {md.version(name)}", end="; ")
    except md.PackageNotFoundError:
        pass
# nvmath loads cuBLAS on the first call, not at import (an import succeeds without the library), so
# make real calls: a failure shows here, in the log, rather than in every GPU test
import nvmath.bindings.cublas as cublas, nvmath.bindings.cublasLt as cublasLt
cublas.destroy(cublas.create())
cublasLt.destroy(cublasLt.create())
try:
    from cuda.pathfinder import load_nvidia_dynamic_lib
    paths = [load_nvidia_dynamic_lib(name).abs_path for name in ("cublas", "cublasLt")]
except Exception as exc:  # only to say which library was picked
    paths = [f"(not found by cuda.pathfinder: {exc})"]
print("cuBLAS and cuBLASLt handles created;", "; ".join(map(str, paths)))
PYEOF
}

pack_logs() {  # on exit: more files in $OUT than a device call brings back -> the logs in one archive
    local count; count=$(find "$OUT" -type f | wc -l)
    ((count > MAX_FILES)) || return 0
    local logs=()
    mapfile -t logs < <(cd "$OUT" && find . -type f ! -path './results/*' ! -name stages.txt | sed 's|^\./||' | sort)
    ((${#logs[@]})) || return 0
    if tar -czf "$OUT/logs.tar.gz" -C "$OUT" "${logs[@]}"; then
        (cd "$OUT" && rm -f "${logs[@]}")
        find "$OUT" -mindepth 1 -type d -empty ! -path "$OUT/results" -delete
        echo "logs: $count files are more than the $MAX_FILES a device call brings back, so the logs are in" \
             "logs.tar.gz (tar xzf logs.tar.gz); the records in results/ are as written" >>"$OUT/stages.txt"
    fi
    count=$(find "$OUT" -type f | wc -l)
    ((count <= MAX_FILES)) ||
        echo "logs: still $count files in $OUT, more than the $MAX_FILES a device call brings back" >>"$OUT/stages.txt"
}

[ "${1:-}" = wheels ] && { download_wheels; exit 0; }
trap pack_logs EXIT
# the records of every session are copied into one bench/results: names of their own (UTC date and
# time of the call), so a later session's catalogue or profile does not replace an earlier one's
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1)" >>"$OUT/stages.txt"
case "${1:-}" in
  check)
    install
    # one process, in a random order (issue: no test may depend on state another left behind);
    # the seed is logged, and SHUFFLE=SEED repeats an order
    seed=${SHUFFLE:-$RANDOM}
    echo "pytest -m gpu in the order of --shuffle $seed" | tee -a "$OUT/stages.txt"
    # How check fits the call: install (limit 60 s), pytest_gpu (420 s: a cold NVRTC cache and the
    # trainer tests) and catalogue (220 s) have 700 s of limits, more than the call's budget of 570 s.
    # The limits are ceilings, not estimates: stage cuts the catalogue's to what pytest leaves, usually
    # all 220 s; if pytest runs into its limit, about 50 s (none if install ran into its own too).
    # kernel --all rewrites its --json after every version, so what ran comes back, and
    # `bash bench/gpu_session.sh catalogue` (a call of its own) then runs it whole.
    stage pytest_gpu 420 $PY -m pytest -m gpu --shuffle "$seed" -q -rs --durations=15 -p no:cacheprovider --junitxml="$OUT/pytest_gpu.xml"
    stage catalogue 220 $PY -m llmcupy.kernel --all --json "$OUT/results/catalogue-$STAMP.json"
    ;;
  catalogue)
    install
    stage catalogue 480 $PY -m llmcupy.kernel --all --json "$OUT/results/catalogue-$STAMP.json"
    ;;
  bench)
    install
    stage bench 450 $PY -m llmcupy.bench --out "$OUT/results" --plot "$OUT/results/sweep.png" --no-progress
    ;;
  step)
    install
    stage trainer_shapes 200 $PY -m llmcupy.bench --trainer-shapes --out "$OUT/results" --no-progress
    stage profile 60 $PY -m llmcupy.profile --init d12 --random-data -b 4 -t 1024 --steps 3 \
      --json "$OUT/results/profile-d12-b4-t1024-$STAMP.json"
    # the trainer reads token files: random GPT-2 tokens in llm.c's format (no data on the device);
    # outside $OUT, whose files are the call's results
    tokens=$(mktemp -d)/random_tokens.bin
    $PY -c "import numpy as np, sys; from llmcupy.data import write_tokens; \
write_tokens(sys.argv[1], np.random.default_rng(0).integers(0, 50257, 8 * 4 * 1024 + 1))" "$tokens"
    stage startup 90 $PY -m llmcupy.startup --out "$OUT/results" --init d12 -i "$tokens" -j "$tokens" -b 4 -t 1024
    ;;
  side)
    [ -d .shared ] || { echo "copy the shared folder to .shared first (see .shared/gpu/side_by_side.sh)"; exit 2; }
    install  # the side-by-side script installs the project too, but not nvmath-python
    # its logs and side_by_side.json go to a folder of their own; the JSON holds the times and the GPU
    # but no date, commit or command, so results/ gets it with those, named by the call's date (a
    # later session's adds to it), read by bench defaults and --list-results as another tool's record
    stage side_by_side 560 env OUT="$OUT/side_by_side" bash .shared/gpu/side_by_side.sh
    command="bash bench/gpu_session.sh side"
    for var in STEPS B T; do [ -n "${!var:-}" ] && command="$var=${!var} $command"; done
    $PY - "$OUT/side_by_side/side_by_side.json" "$OUT/results/side_by_side-$STAMP.json" "$STAMP" "$command" \
        2>&1 <<'PYEOF' | tee -a "$OUT/stages.txt"
import datetime, json, platform, sys
from pathlib import Path
from llmcupy import bench
from llmcupy.fileio import atomic_write

raw_path, out_path, stamp, command = sys.argv[1:]
try:
    raw = json.loads(Path(raw_path).read_text())
except (OSError, ValueError) as exc:   # stopped by its limit, or failed: its log says why
    sys.exit(f"side_by_side: nothing recorded: {raw_path} is missing or unreadable ({exc}); see side_by_side.log")
if not isinstance(raw, dict):
    sys.exit(f"side_by_side: nothing recorded: {raw_path} holds no JSON object")
try:
    software = bench._software_versions()
except Exception as exc:   # a version string is not worth the record
    software = {"python": platform.python_version(), "error": str(exc)}
date = datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").strftime("%Y-%m-%dT%H:%M:%SZ")
# "gpu" is nvidia-smi's "name, driver, memory" line: its name is the device of the other records
device = str(raw.get("gpu", "")).split(",")[0].strip() or "unknown"
record = {"schema": "llmcupy.side_by_side/1", "date": date, "command": command, "backend": "cuda",
          "device": device, "host": platform.node(), "git": bench.git_commit(), "software": software,
          "script": ".shared/gpu/side_by_side.sh"}
record.update((key, value) for key, value in raw.items() if key not in record)   # then the script's own
with atomic_write(out_path) as f:   # bench defaults reads the folder: never half a record there
    f.write((json.dumps(record, indent=1) + "\n").encode())
print(f"side_by_side: recorded {out_path}")
PYEOF
    ;;
  *)
    echo "usage: bash bench/gpu_session.sh wheels|check|catalogue|bench|step|side" >&2
    exit 2
    ;;
esac
