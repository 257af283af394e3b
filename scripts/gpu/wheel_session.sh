#!/usr/bin/env bash
# One step of a GPU lease on the H200 (no network) with ONNX Runtime 1.31.1 from the
# onnxruntime-gpu wheel's libraries, unpacked into /tmp/ortgpu (docs/gpu.md):
#   scripts/gpu/wheel_session.sh build     # install aitune into the image's Python, doctor, C++ tests
#   scripts/gpu/wheel_session.sh install   # the same without the C++ tests
#   scripts/gpu/wheel_session.sh pytest [ARGS]   # the Python suite (CUDA tests included)
#   scripts/gpu/wheel_session.sh suite K[/N]     # part K of N (default 2) of the suite's files; since
#                                                # session 35 use 1/3, 2/3, 3/3: a half no longer fits
#                                                # the device's 10-minute call
#   scripts/gpu/wheel_session.sh python SCRIPT [ARGS]  # a benchmark script with the same environment
# Logs go to $OUT (the device tool's output folder) or /tmp/aitune-gpu.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
out=${OUT:-/tmp/aitune-gpu}
mkdir -p "$out"
export AITUNE_ORT_LIBRARY=/tmp/ortgpu/onnxruntime/capi/libonnxruntime.so.1.31.1
# The image's default g++ links libstdc++ statically, which crashes ORT (docs/gpu.md).
export CC=/usr/bin/gcc CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
d=$repo/.gpu/deps
# The header-only libraries the host lacks, for the tests that configure CMake themselves.
export AITUNE_DEPS_INCLUDE=$d/include
# Small wheels the image lacks (onnxconverter-common), carried in .whl.
if [ -d .whl ] && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site
# onnxruntime-genai and the onnxruntime Python package its model builder imports, carried in
# .genai, for decoder.py's reference row only (--genai-site /tmp/genai-site: the builder's
# subprocess alone gets them, so this process's ONNX Runtime stays the GPU wheel's).
if [ -d .genai ] && [ ! -d /tmp/genai-site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/genai-site .genai/*.whl
fi
step=${1:?step}; shift
case "$step" in
  install)  # the wheel alone (~45 s), for a short lease that runs benchmarks only
    nvidia-smi -L
    python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu-wheel \
      -C cmake.define.AITUNE_ORT_ROOT=$d/onnxruntime -C cmake.define.AITUNE_DEPS_INCLUDE=$d/include . 2>&1 | tail -40
    aitune doctor 2>&1 | tail -5 ;;
  build)
    nvidia-smi -L
    { python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu-wheel \
        -C cmake.define.AITUNE_ORT_ROOT=$d/onnxruntime -C cmake.define.AITUNE_DEPS_INCLUDE=$d/include . 2>&1 | tail -40
      aitune doctor
      cmake -S . -B build/gpu-tests -G Ninja -DAITUNE_BUILD_PYTHON=OFF -DAITUNE_BUILD_TESTS=ON \
        -DAITUNE_ORT_ROOT=$d/onnxruntime -DAITUNE_DEPS_INCLUDE=$d/include -DAITUNE_GTEST_SOURCE=$d/googletest \
        -DAITUNE_ORT_LIBRARY=$AITUNE_ORT_LIBRARY >/dev/null && cmake --build build/gpu-tests -j16 2>&1 | tail -30
    } 2>&1 | tee "$out/build.log"
    ctest --test-dir build/gpu-tests --output-on-failure -j4 2>&1 | tee "$out/ctest.log" | tail -60 ;;
  pytest)
    python3 -m pytest -q -rs "$@" 2>&1 | tee "$out/pytest.log" | tail -80 ;;
  suite)  # the test files alternately in parts (K of N, default N=2), -n 12: the whole suite in N calls
    part=${1:?K or K/N}; shift
    k=${part%/*}; n=2; [ "$part" != "$k" ] && n=${part#*/}
    files=$(ls tests/python/test_*.py | awk -v k="$k" -v n="$n" 'NR % n == k % n')
    python3 -m pytest -q -rs -n 12 --dist loadfile --timeout 300 -p no:randomly "$@" $files 2>&1 \
      | tee "$out/pytest-$k-of-$n.log" | tail -80 ;;
  python)
    python3 "$@" 2>&1 | tee "$out/python.log" | tail -120 ;;
esac
