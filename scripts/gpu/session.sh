#!/usr/bin/env bash
# One GPU lease, after the ORT GPU parts were unpacked into /root/ortgpu (see docs/gpu.md):
# builds aitune there (no network), runs the C++ and Python tests with the CUDA provider
# and the MLP latency comparison, writing logs to $OUT.
#   scripts/gpu/session.sh [pytest args...]
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
out=${OUT:-/tmp/aitune-gpu}
mkdir -p "$out"
site=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$site/nvidia/cu13/lib:$site/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export AITUNE_ORT_LIBRARY=/root/ortgpu/lib/libonnxruntime.so.1
export PYTHONUNBUFFERED=1
export AITUNE_GPU_REPORT_DIR=$out
# The image's CXX (/opt/gcc) links its own libstdc++ statically into the extension; ORT,
# dlopened from there, then crashes in std::codecvt while creating its Env. The
# system g++ links the shared libstdc++ that ORT uses too.
export CC=/usr/bin/gcc CXX=/usr/bin/g++
mkdir -p /root/ortgpu/include && cp .gpu/deps/onnxruntime/include/*.h /root/ortgpu/include/
nvidia-smi -L
{
  python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu-sys \
    -C cmake.define.AITUNE_ORT_ROOT=/root/ortgpu -C cmake.define.AITUNE_DEPS_INCLUDE="$repo/.gpu/deps/include" \
    . 2>&1 | tail -40
  aitune doctor || cuda-gdb -batch -ex run -ex bt --args python3 -c \
    "import aitune._core as c; c.cli_main(['aitune', 'doctor'])" 2>&1 | grep -v '^\[New' | tail -30
  # The C++ tests build separately, so that a test that fails to compile cannot stop the rest.
  cmake -S . -B build/gpu-sys-tests -G Ninja -DAITUNE_BUILD_PYTHON=OFF -DAITUNE_BUILD_TESTS=ON \
    -DAITUNE_ORT_ROOT=/root/ortgpu -DAITUNE_DEPS_INCLUDE="$repo/.gpu/deps/include" \
    -DAITUNE_GTEST_SOURCE="$repo/.gpu/deps/googletest" >/dev/null && cmake --build build/gpu-sys-tests -j16 2>&1 | tail -30
} 2>&1 | tee "$out/build.log"
ctest --test-dir build/gpu-sys-tests --output-on-failure 2>&1 | tee "$out/ctest.log" | tail -40
python3 -m pytest -q -rs tests/python "$@" 2>&1 | tee "$out/pytest.log" | tail -40
bash scripts/gpu/bench_mlp.sh 2>&1 | tee "$out/bench_mlp.log"
