#!/usr/bin/env bash
# `aitune run` p50 against a raw ORT C++ IOBinding loop (benchmarks/raw_ort_loop.cpp) on
# the example MLP, alternating three times so drift hits both alike.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
ort=$(dirname "$AITUNE_ORT_LIBRARY")
mkdir -p "$repo/build/bench"
python3 "$repo/examples/make_example_mlp.py" "$repo/build/bench/mlp.onnx"
/usr/bin/g++ -O2 -std=c++20 -I/root/ortgpu/include "$repo/benchmarks/raw_ort_loop.cpp" -o "$repo/build/bench/raw_ort_loop" \
  -L"$ort" -l:libonnxruntime.so.1 -Wl,-rpath,"$ort"
for round in 1 2 3 4 5; do
  echo "round $round raw:    $(ORT_LIB_DIR=$ort "$repo/build/bench/raw_ort_loop" "$repo/build/bench/mlp.onnx" cuda 1 2000)"
  echo "round $round aitune: $(aitune run "$repo/build/bench/mlp.onnx" --provider cuda --iterations 2000 --warmup 20 | tail -1)"
done
