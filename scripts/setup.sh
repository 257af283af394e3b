#!/usr/bin/env bash
# One-time set-up of a fresh machine for building and testing aitune. Idempotent:
# installs only what is missing.
#   1. Debian packages: compiler, CMake, Ninja, header-only libraries, GoogleTest,
#      OpenSSL headers (libcrypto: sha256 of checkpoint files), npm;
#   2. a virtual environment .venv with pinned Python packages (torch pinned to the
#      2.13.0 CPU wheel; an unpinned torch would pull a multi-GB CUDA build);
#   3. ONNX Runtime 1.29.0 from npm, sha256-checked (scripts/fetch-onnxruntime.sh).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

debs=(cmake ninja-build g++ make python3-venv libgtest-dev nlohmann-json3-dev libcli11-dev libdlpack-dev libssl-dev npm)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  # python3-venv / npm may be provided by a non-Debian Python / Node; only insist where absent.
  filtered=()
  for p in "${missing[@]}"; do
    case "$p" in
      python3-venv) python3 -c "import venv, ensurepip" 2>/dev/null || filtered+=("$p") ;;
      npm) command -v npm >/dev/null || filtered+=("$p") ;;
      cmake) command -v cmake >/dev/null || filtered+=("$p") ;;
      g++) command -v g++ >/dev/null || filtered+=("$p") ;;
      make) command -v make >/dev/null || filtered+=("$p") ;;
      *) filtered+=("$p") ;;
    esac
  done
  if [ ${#filtered[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${filtered[*]}" >&2
    sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${filtered[@]}" >/dev/null
  fi
fi

python_pins=(torch==2.13.0 numpy onnx==1.23.1 onnxscript==0.7.2 onnxconverter-common==1.16.0 onnxruntime==1.30.0 transformers==5.24.0 pytest
             nanobind==3.1.0 scikit-build-core==1.1.2 tqdm)
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  python3 -m venv .venv
fi
stamp=.venv/.aitune-pins
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "${python_pins[*]}" ]; then
  echo "setup: installing Python packages into .venv: ${python_pins[*]}" >&2
  .venv/bin/python -m pip install -q "${python_pins[@]}"
  echo "${python_pins[*]}" > "$stamp"
fi

scripts/fetch-onnxruntime.sh
