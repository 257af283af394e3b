#!/usr/bin/env bash
# GPU diagnostic: builds scripts/gpu/probe_cuda_graph.cpp against the unpacked ORT GPU
# build and runs it on the MLP and ResNet-18 of benchmarks/models.py (see the .cpp).
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/aitune-gpu}
mkdir -p "$out" "$repo/build/probe"
site=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$site/nvidia/cu13/lib:$site/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ORT_LIB_DIR=/root/ortgpu/lib
mkdir -p /root/ortgpu/include && cp "$repo"/.gpu/deps/onnxruntime/include/*.h /root/ortgpu/include/
/usr/bin/g++ -O2 -std=c++20 -I/root/ortgpu/include -I/usr/local/cuda/include "$repo/scripts/gpu/probe_cuda_graph.cpp" \
  -o "$repo/build/probe/probe" -L"$ORT_LIB_DIR" -l:libonnxruntime.so.1 -Wl,-rpath,"$ORT_LIB_DIR" \
  -L/usr/local/cuda/lib64 -lcudart || exit 1
python3 - "$repo/build/probe" <<'PY' 2>&1 | grep -v Warning
import sys, torch
sys.path.insert(0, "benchmarks")
import models
d = sys.argv[1]
for name, m, shape in [("mlp", models.MLP(), (1, 256)), ("resnet", models.resnet18()[0], (1, 3, 224, 224))]:
    torch.onnx.export(m.eval(), (torch.randn(*shape),), f"{d}/{name}.onnx", dynamo=False, input_names=["x"], output_names=["y"])
PY
for m in mlp resnet; do echo "== $m"; "$repo/build/probe/probe" "$repo/build/probe/$m.onnx" 1 2>&1 | grep -v "^20..-"; done
