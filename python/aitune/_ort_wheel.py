"""Finds ONNX Runtime's PyPI wheel and the pip CUDA libraries, without importing onnxruntime.

The engine loads `libonnxruntime.so.1*` from the `onnxruntime` or `onnxruntime-gpu` wheel
(`onnxruntime/capi/`) and preloads the CUDA / cuDNN libraries of the pip `nvidia-*`
packages (`nvidia/*/lib`) before a GPU provider loads. Importing onnxruntime would start
its own, separate ONNX Runtime, so only import machinery and package metadata are used.
Standalone too: `python _ort_wheel.py` prints what it finds as JSON (CMake reads it to
compile the defaults of the C++ tests in).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import json
import re
import sys
from pathlib import Path

# Both install the `onnxruntime` package; the GPU one is looked for first.
DISTRIBUTIONS = ("onnxruntime-gpu", "onnxruntime")
_LIBRARY = re.compile(r"^libonnxruntime\.so\.1(\.\d+)*$")


def _package_dir(name: str) -> list[Path]:
    """The folders of a top-level package (several for a namespace package like nvidia)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def _library_in(capi: Path) -> str:
    """The newest libonnxruntime.so.1* in capi ("" if none); the wheel has no symlink."""
    found = [p for p in capi.glob("libonnxruntime.so.1*") if _LIBRARY.match(p.name)]
    if not found:
        return ""
    version = lambda p: [int(x) for x in p.name[len("libonnxruntime.so."):].split(".")]  # noqa: E731
    return str(max(found, key=version))


def _name(dist: importlib.metadata.Distribution) -> str:
    """The distribution's name as DISTRIBUTIONS spells it ("onnxruntime-gpu", not "onnxruntime_gpu")."""
    return re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()


def _record_matches(dist: importlib.metadata.Distribution, library: Path) -> bool:
    """True when `dist`'s RECORD lists `library` with the sha256 of the file on disk."""
    for entry in dist.files or []:
        if entry.hash is None or entry.hash.mode != "sha256":
            continue
        if Path(dist.locate_file(entry)).resolve() != library.resolve():
            continue
        digest = base64.urlsafe_b64encode(hashlib.sha256(library.read_bytes()).digest()).rstrip(b"=").decode()
        return digest == entry.hash.value
    return False


def find() -> dict:
    """What the engine needs: the wheel's distribution, version, capi folder and library,
    a warning when both distributions are installed, and the nvidia/*/lib folders. With
    both installed, the distribution is the one whose RECORD sha256 matches the library
    on disk (the wheel installed last), else onnxruntime-gpu."""
    result = {"distribution": "", "version": "", "capi_dir": "", "library": "", "warning": "",
              "cuda_library_dirs": []}
    packages = _package_dir("onnxruntime")
    if packages and (packages[0] / "capi").is_dir():
        package = packages[0]
        result["capi_dir"] = str(package / "capi")
        result["library"] = _library_in(package / "capi")
        owners = []
        for name in DISTRIBUTIONS:
            try:
                dist = importlib.metadata.distribution(name)
            except importlib.metadata.PackageNotFoundError:
                continue
            if Path(dist.locate_file("onnxruntime")).resolve() == package.resolve():
                owners.append(dist)
        if len(owners) > 1 and result["library"]:
            # Both wheels write the same onnxruntime/capi/libonnxruntime.so.1.*: the bytes on
            # disk are those of the wheel installed last. Each wheel's RECORD holds the
            # sha256 of its copy, so the owner of the library that will load is known.
            matching = [d for d in owners if _record_matches(d, Path(result["library"]))]
            if len(matching) == 1:
                owners.sort(key=lambda d: d is not matching[0])
        if owners:
            result["distribution"], result["version"] = _name(owners[0]), owners[0].version
        if len(owners) > 1:
            first, second = owners[0], owners[1]
            result["warning"] = (
                f"both {_name(first)} {first.version} and {_name(second)} {second.version} are installed in "
                f"{package.parent}; they share the onnxruntime package, so its files are those installed "
                f"last (the library here is {_name(first)}'s"
                + ("" if _name(first) == "onnxruntime-gpu" else
                   ", whose core is the CPU build: CUDA may not work")
                + "): uninstall both and install one")
    for nvidia in _package_dir("nvidia"):
        result["cuda_library_dirs"] += sorted(str(d) for d in nvidia.glob("*/lib") if d.is_dir())
    return result


def register(core) -> None:
    """Hands what find() found to the engine (before anything loads ONNX Runtime)."""
    found = find()
    wheel = core.OrtWheel()
    wheel.distribution, wheel.version = found["distribution"], found["version"]
    wheel.capi_dir, wheel.warning = found["capi_dir"], found["warning"]
    core.OrtRuntime.use_python_packages(wheel, found["cuda_library_dirs"])


if __name__ == "__main__":
    json.dump(find(), sys.stdout)
    sys.stdout.write("\n")
