#!/usr/bin/env bash
# Fetches the pinned ONNX Runtime 1.29.0 (C/C++ headers + Linux x86-64 core library)
# from the npm registry, checks its sha256, caches the tarball outside the tree and
# extracts only the headers and the library into DEST (default: .deps/onnxruntime).
#
#   scripts/fetch-onnxruntime.sh [DEST]
#
# The tarball cache is ${AITUNE_DOWNLOAD_CACHE:-$HOME/.cache/aitune/downloads}.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$repo/.deps/onnxruntime}
cache=${AITUNE_DOWNLOAD_CACHE:-$HOME/.cache/aitune/downloads}
pkg=com.github.asus4.onnxruntime
ver=0.4.9
sha=e59788788818fdde1b2e522e766a21ba0f7d8391de55737abf81e32cc801785d
ort_version=1.29.0
headers='package/Plugins/iOS~/onnxruntime.xcframework/ios-arm64/onnxruntime.framework/Headers'
lib='package/Plugins/Linux/x64/libonnxruntime.so'

if [ -f "$dest/VERSION" ] && [ "$(cat "$dest/VERSION")" = "$ort_version $sha" ]; then
  exit 0
fi
mkdir -p "$cache"
tgz="$cache/$pkg-$ver.tgz"
if [ ! -f "$tgz" ] || ! echo "$sha  $tgz" | sha256sum -c --status; then
  echo "fetching $pkg@$ver (ONNX Runtime $ort_version) from npm..." >&2
  rm -f "$tgz"
  (cd "$cache" && npm pack --silent "$pkg@$ver" >/dev/null)
fi
if ! echo "$sha  $tgz" | sha256sum -c --status; then
  echo "error: sha256 mismatch for $tgz (expected $sha); delete it and retry" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$tgz" -C "$tmp" "$headers" "$lib"
mkdir -p "$tmp/out/include" "$tmp/out/lib"
cp "$tmp/$headers"/*.h "$tmp/out/include/"
cp "$tmp/$lib" "$tmp/out/lib/libonnxruntime.so.$ort_version"
ln -s "libonnxruntime.so.$ort_version" "$tmp/out/lib/libonnxruntime.so.1"
ln -s "libonnxruntime.so.1" "$tmp/out/lib/libonnxruntime.so"
echo "$ort_version $sha" > "$tmp/out/VERSION"
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$tmp/out" "$dest"
echo "ONNX Runtime $ort_version in $dest" >&2
