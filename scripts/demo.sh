#!/usr/bin/env bash
# The main job: (1) tune a small CNN defined in examples/ end to end with aitune.torch on
# the best provider here and compare it with eager; (2) run the bundled example ONNX
# model (an MLP, random weights) through the `aitune` command line.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out="$repo/build/demo"
mkdir -p "$out"
export AITUNE_CACHE_DIR="$out/cache"
aitune doctor
echo "== aitune.torch: tune a small CNN"
python "$repo/examples/tune_small_cnn.py"
echo "== aitune CLI: run an ONNX model"
python "$repo/examples/make_example_mlp.py" "$out/example_mlp.onnx"
aitune inspect "$out/example_mlp.onnx"
aitune run "$out/example_mlp.onnx" --provider auto --dim batch=8 --iterations 200
