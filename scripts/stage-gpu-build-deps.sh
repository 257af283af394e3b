#!/usr/bin/env bash
# Copies the build-time dependencies that a GPU host without network lacks (header-only
# libraries, GoogleTest sources, ORT headers) into DEST, to be carried there. Build
# there with:  -DAITUNE_DEPS_INCLUDE=DEST/include -DAITUNE_GTEST_SOURCE=DEST/googletest
#              -DAITUNE_ORT_ROOT=DEST/onnxruntime
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:?usage: stage-gpu-build-deps.sh DEST}
rm -rf "$dest" && mkdir -p "$dest/include" "$dest/onnxruntime/lib"
cp -r /usr/include/nlohmann /usr/include/CLI /usr/include/dlpack "$dest/include/"
cp -r /usr/src/googletest "$dest/googletest"
cp -r "$repo/.deps/onnxruntime/include" "$dest/onnxruntime/include"
du -sh "$dest" >&2
