#!/usr/bin/env bash
# The GPU checks a session runs when it is lent a GPU, in four device calls of under 10 minutes,
# each writing its logs and JSON records to $OUT (copy the records into bench/results/, run
# `python -m llmcupy.bench defaults` to update bench/defaults.json from them, and commit):
#
#   bash bench/gpu_session.sh check    # install; pytest -m gpu; kernel --all --json
#   bash bench/gpu_session.sh bench    # bench sweep of every version at the ops' sizes
#   bash bench/gpu_session.sh step     # the step's ops at the trainer's shapes (for the defaults);
#                                      # profile and start-up times of GPT-2 124M
#   bash bench/gpu_session.sh side     # llm.c's FP32 trainer and PyTorch side by side (.shared/gpu)
#
# Each stage has its own time limit, so a slow or hung stage costs its limit, not the whole call,
# and what finished before it still comes back. Run from the project's root.
set -uo pipefail
OUT=${OUT:-/tmp/llmcupy_gpu_session}; mkdir -p "$OUT/results"
export PYTHONUNBUFFERED=1 LLMCUPY_BACKEND=${LLMCUPY_BACKEND:-cuda}
PY=${PYTHON:-python3}

stage() {  # stage NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.log, say how it ended
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc after $((SECONDS - t0)) s (limit $limit s; log $name.log)" | tee -a "$OUT/stages.txt"
  tail -n 4 "$OUT/$name.log"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/gpu.txt" 2>&1
case "${1:-}" in
  check)
    stage install 120 $PY -m pip install --no-deps --no-build-isolation -e .
    stage pytest_gpu 300 $PY -m pytest -m gpu -q -p no:cacheprovider --junitxml="$OUT/pytest_gpu.xml"
    stage catalogue 150 $PY -m llmcupy.kernel --all --json "$OUT/results/catalogue.json"
    ;;
  bench)
    stage install 120 $PY -m pip install --no-deps --no-build-isolation -e .
    stage bench 450 $PY -m llmcupy.bench --out "$OUT/results" --plot "$OUT/results/sweep.png" --no-progress
    ;;
  step)
    stage install 120 $PY -m pip install --no-deps --no-build-isolation -e .
    stage trainer_shapes 200 $PY -m llmcupy.bench --trainer-shapes --out "$OUT/results" --no-progress
    stage profile 60 $PY -m llmcupy.profile --init d12 --random-data -b 4 -t 1024 --steps 3
    # the trainer reads token files: random GPT-2 tokens in llm.c's format (no data on the device)
    $PY -c "import numpy as np, sys; from llmcupy.data import write_tokens; \
write_tokens(sys.argv[1], np.random.default_rng(0).integers(0, 50257, 8 * 4 * 1024 + 1))" "$OUT/random_tokens.bin"
    stage startup 90 $PY -m llmcupy.startup --out "$OUT/results" --init d12 -i "$OUT/random_tokens.bin" \
      -j "$OUT/random_tokens.bin" -b 4 -t 1024
    ;;
  side)
    [ -d .shared ] || { echo "copy the shared folder to .shared first (see .shared/gpu/side_by_side.sh)"; exit 2; }
    stage side_by_side 560 env OUT="$OUT/results" bash .shared/gpu/side_by_side.sh
    ;;
  *)
    echo "usage: bash bench/gpu_session.sh check|bench|step|side" >&2
    exit 2
    ;;
esac
