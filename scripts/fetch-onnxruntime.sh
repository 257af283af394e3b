#!/usr/bin/env bash
# Fetches the pinned ONNX Runtime C/C++ API headers (1.29.0, ORT_API_VERSION 29) from the
# npm registry, checks the tarball's sha256, caches it outside the tree and extracts only
# the headers into DEST/include (default DEST: .deps/onnxruntime). The runtime library is
# not taken from here: it comes from the onnxruntime / onnxruntime-gpu PyPI wheel
# (scripts/setup.sh), and the engine refuses one older than these headers' API version.
#
#   scripts/fetch-onnxruntime.sh [DEST]
#
# The tarball cache is ${AITUNE_DOWNLOAD_CACHE:-$HOME/.cache/aitune/downloads}.
# (com.github.asus4.onnxruntime 0.4.9 is the newest version of that package on npm, and
# the C API is backward compatible: headers of API 29 drive the 1.31 library.)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$repo/.deps/onnxruntime}
cache=${AITUNE_DOWNLOAD_CACHE:-$HOME/.cache/aitune/downloads}
pkg=com.github.asus4.onnxruntime
ver=0.4.9
sha=e59788788818fdde1b2e522e766a21ba0f7d8391de55737abf81e32cc801785d
ort_version=1.29.0
headers='package/Plugins/iOS~/onnxruntime.xcframework/ios-arm64/onnxruntime.framework/Headers'
stamp="headers $ort_version $sha"

# A tree fetched by the earlier version of this script ("$ort_version $sha": the same
# headers plus a runtime library, which nothing uses now) is kept as it is.
if [ -f "$dest/VERSION" ] && { [ "$(cat "$dest/VERSION")" = "$stamp" ] ||
                               [ "$(cat "$dest/VERSION")" = "$ort_version $sha" ]; }; then
  exit 0
fi
mkdir -p "$cache"
tgz="$cache/$pkg-$ver.tgz"
if [ ! -f "$tgz" ] || ! echo "$sha  $tgz" | sha256sum -c --status; then
  echo "fetching $pkg@$ver (ONNX Runtime $ort_version headers) from npm..." >&2
  rm -f "$tgz"
  (cd "$cache" && npm pack --silent "$pkg@$ver" >/dev/null)
fi
if ! echo "$sha  $tgz" | sha256sum -c --status; then
  echo "error: sha256 mismatch for $tgz (expected $sha); delete it and retry" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$tgz" -C "$tmp" "$headers"
mkdir -p "$tmp/out/include"
cp "$tmp/$headers"/*.h "$tmp/out/include/"
echo "$stamp" > "$tmp/out/VERSION"
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$tmp/out" "$dest"
echo "ONNX Runtime $ort_version headers in $dest" >&2
