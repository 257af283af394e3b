#!/usr/bin/env bash
# The main job: writes the bundled example model (an MLP, random weights) and runs it
# through the `aitune` command line on the best provider available here.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out="$repo/build/demo"
mkdir -p "$out"
python "$repo/examples/make_example_mlp.py" "$out/example_mlp.onnx"
aitune doctor
aitune inspect "$out/example_mlp.onnx"
aitune run "$out/example_mlp.onnx" --provider auto --dim batch=8 --iterations 200
