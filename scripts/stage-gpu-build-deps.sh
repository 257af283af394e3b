#!/usr/bin/env bash
# Copies the build-time dependencies that a GPU host without network lacks (header-only
# libraries, OpenSSL's headers, GoogleTest sources, ORT headers) into DEST, to be carried
# there. Build there with:  -DAITUNE_DEPS_INCLUDE=DEST/include -DAITUNE_GTEST_SOURCE=DEST/googletest
#                           -DAITUNE_ORT_ROOT=DEST/onnxruntime
# OpenSSL: the host needs only the runtime libcrypto.so.3 (libssl3), which CMake falls back
# to when the unversioned libcrypto.so of libssl-dev is absent (cmake/AituneDependencies.cmake).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:?usage: stage-gpu-build-deps.sh DEST}
rm -rf "$dest" && mkdir -p "$dest/include" "$dest/onnxruntime"
cp -r /usr/include/nlohmann /usr/include/CLI /usr/include/dlpack "$dest/include/"
# OpenSSL's headers are split: the portable ones and the per-architecture configuration
# (configuration.h, opensslconf.h); merged into one DEST/include/openssl.
cp -r /usr/include/openssl "$dest/include/"
cp /usr/include/x86_64-linux-gnu/openssl/*.h "$dest/include/openssl/"
cp -r /usr/src/googletest "$dest/googletest"
cp -r "$repo/.deps/onnxruntime/include" "$dest/onnxruntime/include"
du -sh "$dest" >&2
