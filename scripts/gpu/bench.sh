#!/usr/bin/env bash
# The GPU benchmark of docs/benchmarks.md, in a lease where scripts/gpu/session.sh has
# built aitune: builds the raw ORT loop (the floor) and runs benchmarks/gpu_benchmarks.py.
#   scripts/gpu/bench.sh [gpu_benchmarks.py args...]
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/aitune-gpu}
mkdir -p "$out" "$repo/build/bench"
site=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$site/nvidia/cu13/lib:$site/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export AITUNE_ORT_LIBRARY=/root/ortgpu/lib/libonnxruntime.so.1
ort=$(dirname "$AITUNE_ORT_LIBRARY")
/usr/bin/g++ -O2 -std=c++20 -I/root/ortgpu/include "$repo/benchmarks/raw_ort_loop.cpp" -o "$repo/build/bench/raw_ort_loop" \
  -L"$ort" -l:libonnxruntime.so.1 -Wl,-rpath,"$ort"
python3 "$repo/benchmarks/gpu_benchmarks.py" --raw-loop "$repo/build/bench/raw_ort_loop" \
  --out "$out/gpu_benchmarks.json" "$@" 2>&1 | grep -v "^W1\|Warning\|warn(" | tee "$out/bench.log"
