#!/usr/bin/env bash
# One-time set-up of a fresh machine for building and testing aitune. Idempotent:
# installs only what is missing.
#   1. Debian packages: compiler, CMake, Ninja, header-only libraries, GoogleTest,
#      OpenSSL headers (libcrypto: sha256 of checkpoint files), npm, chromium (tests open the
#      tune report page in it, headless);
#   2. a virtual environment .venv with pinned Python packages, ONNX Runtime among them as
#      its PyPI wheel (the engine loads the wheel's libonnxruntime). Without an NVIDIA GPU:
#      onnxruntime==1.31.1 and torch 2.13.0 (the CPU wheel where the index has it). With
#      one (`nvidia-smi -L` succeeds; AITUNE_GPU=0/1 overrides): onnxruntime-gpu[cuda,cudnn]
#      ==1.31.1 (its CUDA 13 / cuDNN 9 libraries as pip nvidia-* packages) and a CUDA build
#      of torch 2.13.0 (from ${AITUNE_TORCH_CUDA_INDEX:-https://download.pytorch.org/whl/cu130}).
#      The two ORT wheels install the same `onnxruntime` package, so only one is kept;
#   3. the ONNX Runtime C API headers (1.29.0) from npm, sha256-checked
#      (scripts/fetch-onnxruntime.sh); no runtime library is downloaded there.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

# An NVIDIA GPU is there when `nvidia-smi -L` succeeds and lists one; AITUNE_GPU=0/1 overrides.
detect_gpu() {
  if [ -n "${AITUNE_GPU:-}" ]; then
    case "$AITUNE_GPU" in
      0|1) echo "$AITUNE_GPU"; return ;;
      *) echo "setup: AITUNE_GPU must be 0 or 1, not '$AITUNE_GPU'" >&2; return 2 ;;
    esac
  fi
  local listed
  if listed=$(nvidia-smi -L 2>/dev/null) && grep -q '^GPU [0-9]' <<<"$listed"; then echo 1; else echo 0; fi
}

gpu=$(detect_gpu)
torch_cuda_index=${AITUNE_TORCH_CUDA_INDEX:-https://download.pytorch.org/whl/cu130}
common_pins=(numpy onnx==1.23.1 onnxscript==0.7.2 onnxconverter-common==1.16.0 pytest
             pytest-xdist==3.8.0  # make test runs the suite in parallel (Makefile: PYTEST_WORKERS)
             nanobind==3.1.0 scikit-build-core==1.1.2 tqdm transformers==5.17.0 diffusers==0.36.0
             tritonclient==2.73.0 protobuf==7.36.2  # Triton's model-config protobuf (tests)
             "ray[serve]==2.60.0"  # aitune.serve (the serving extra), tested by tests/python/test_serve.py
             onnxruntime-genai==0.18.0)  # its model builder: decoder.py's reference row (test_genai_reference.py)
if [ "$gpu" = 1 ]; then
  ort_pin="onnxruntime-gpu[cuda,cudnn]==1.31.1"; ort_dist=onnxruntime-gpu; other_dist=onnxruntime
  pip_index=(--extra-index-url "$torch_cuda_index")
else
  ort_pin="onnxruntime==1.31.1"; ort_dist=onnxruntime; other_dist=onnxruntime-gpu
  pip_index=()
fi
python_pins=(torch==2.13.0 "$ort_pin" "${common_pins[@]}")

# `setup.sh --print-plan`: what this machine would get, installing nothing (tests read it).
if [ "${1:-}" = --print-plan ]; then
  echo "gpu=$gpu"
  echo "ort_dist=$ort_dist"
  echo "other_dist=$other_dist"
  echo "pip_index=${pip_index[*]}"
  echo "python_pins=${python_pins[*]}"
  exit 0
fi

# chromium: the tests open the tune report's HTML page in it (headless) and check what it shows.
debs=(cmake ninja-build g++ make python3-venv libgtest-dev nlohmann-json3-dev libcli11-dev libdlpack-dev libssl-dev npm chromium)
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

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  python3 -m venv .venv
fi
pip=(.venv/bin/python -m pip)
installed() { "${pip[@]}" show -q "$1" >/dev/null 2>&1; }
stamp=.venv/.aitune-pins
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "${python_pins[*]}" ]; then
  echo "setup: installing Python packages into .venv: ${python_pins[*]}" >&2
  reinstall_ort=0
  if installed "$other_dist"; then
    # Uninstalling it removes files of the shared `onnxruntime` package: reinstall ours after.
    echo "setup: replacing $other_dist by $ort_dist (they share the onnxruntime package)" >&2
    "${pip[@]}" uninstall -q -y "$other_dist"
    reinstall_ort=1
  fi
  "${pip[@]}" install -q "${pip_index[@]}" "${python_pins[@]}"
  # A package depending on the plain `onnxruntime` can pull the other wheel in too.
  if installed "$other_dist"; then
    echo "setup: $other_dist came in as a dependency; removing it (it shares the onnxruntime package)" >&2
    "${pip[@]}" uninstall -q -y "$other_dist"
    reinstall_ort=1
  fi
  if [ "$reinstall_ort" = 1 ]; then
    "${pip[@]}" install -q --force-reinstall --no-deps "$ort_dist==1.31.1"
  fi
  if [ "$gpu" = 1 ] && ! .venv/bin/python -c "import sys, torch; sys.exit(torch.version.cuda is None)"; then
    echo "setup: .venv has a CPU build of torch; installing the CUDA build from $torch_cuda_index" >&2
    "${pip[@]}" install -q --force-reinstall --no-deps --index-url "$torch_cuda_index" torch==2.13.0
    "${pip[@]}" install -q "${pip_index[@]}" torch==2.13.0  # its nvidia-* dependencies
  fi
  echo "${python_pins[*]}" > "$stamp"
fi

scripts/fetch-onnxruntime.sh
