#!/usr/bin/env bash
# The zoo on the H200, one process per model inside a time budget (an abort or a hang of one
# model costs only its row; the device allows 10 minutes a command). Run after
# `scripts/gpu/wheel_session.sh build` in the same lease:
#   scripts/gpu/zoo_each.sh BUDGET_S MODEL [MODEL ...]
# Writes $OUT/zoo-MODEL.json per model and $OUT/zoo.txt (the log, with each model's exit
# status: 134 is an abort); prints each row's table line.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
out=${OUT:-/tmp/aitune-gpu}
mkdir -p "$out"
budget=${1:?BUDGET_S}; shift
export AITUNE_ORT_LIBRARY=/tmp/ortgpu/onnxruntime/capi/libonnxruntime.so.1.31.1 PYTHONUNBUFFERED=1
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site
start=$SECONDS
for model in "$@"; do
  left=$((budget - (SECONDS - start)))
  [ "$left" -lt 40 ] && { echo "== $model skipped: ${left} s left" >> "$out/zoo.txt"; continue; }
  echo "== $model (${left} s left) $(date +%T)" >> "$out/zoo.txt"
  timeout "$left" python3 benchmarks/zoo.py --models "$model" --iterations 100 --json "$out/zoo-$model.json" \
    >> "$out/zoo.txt" 2>&1
  echo "== $model exit $? at $((SECONDS - start)) s" >> "$out/zoo.txt"
done
grep -E "^==|^\| [a-z]" "$out/zoo.txt" | grep -v "^| model"
