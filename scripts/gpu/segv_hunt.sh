#!/usr/bin/env bash
# The crash of session 24 (a segmentation fault in test_fusions.py's CUDA-graph test while
# 14 test processes shared the GPU, docs/gpu.md): the test alone, then COPIES copies of it at
# once, each with native frames on a fatal signal (segv_backtrace.c; Python's faulthandler is
# off: with it on, the native handler never printed in session 25). Run after
# `wheel_session.sh install`:
#   scripts/gpu/segv_hunt.sh [COPIES] [ROUNDS]
# Logs: $OUT/segv-alone.log, $OUT/segv-copy-N-R.log; a summary on stdout.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
out=${OUT:-/tmp/aitune-gpu}
mkdir -p "$out"
copies=${1:-14}
rounds=${2:-1}
export AITUNE_ORT_LIBRARY=/tmp/ortgpu/onnxruntime/capi/libonnxruntime.so.1.31.1
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site
gcc -shared -fPIC -O1 -g -o /tmp/segv_backtrace.so scripts/gpu/segv_backtrace.c -ldl || exit 1
test_id="tests/python/test_fusions.py::test_fused_graphs_capture_into_cuda_graphs_on_the_gpu"
LD_PRELOAD=/tmp/segv_backtrace.so python3 -m pytest -q -p no:randomly -p no:cacheprovider -p no:faulthandler "$test_id" \
  > "$out/segv-alone.log" 2>&1
echo "alone: rc=$? $(tail -1 "$out/segv-alone.log")"
for r in $(seq 1 "$rounds"); do
  pids=()
  for c in $(seq 1 "$copies"); do
    LD_PRELOAD=/tmp/segv_backtrace.so python3 -m pytest -q -p no:randomly -p no:cacheprovider -p no:faulthandler "$test_id" \
      > "$out/segv-copy-$c-$r.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"; rc=$?
    log="$out/segv-copy-$((i + 1))-$r.log"
    echo "round $r copy $((i + 1)): rc=$rc $(tail -1 "$log")"
    grep -q "native frames" "$log" && grep -A30 "native frames" "$log" | head -40
  done
done
