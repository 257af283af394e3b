"""Finds ONNX Runtime's PyPI wheel and the pip CUDA libraries, without importing onnxruntime.

The engine loads `libonnxruntime.so.1*` from the `onnxruntime` or `onnxruntime-gpu` wheel
(`onnxruntime/capi/`) and preloads the CUDA / cuDNN libraries of the pip `nvidia-*`
packages (`nvidia/*/lib`) before a GPU provider loads. Importing onnxruntime would start
its own, separate ONNX Runtime, so only import machinery and package metadata are used.
Standalone too: `python _ort_wheel.py` prints what it finds as JSON (CMake reads it to
compile the defaults of the C++ tests in).
"""

from __future__ import annotations

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


def find() -> dict:
    """What the engine needs: the wheel's distribution, version, capi folder and library,
    a warning when both distributions are installed, and the nvidia/*/lib folders."""
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
                owners.append((name, dist.version))
        if owners:
            result["distribution"], result["version"] = owners[0]
        if len(owners) > 1:
            result["warning"] = (
                f"both {owners[0][0]} {owners[0][1]} and {owners[1][0]} {owners[1][1]} are installed in "
                f"{package.parent}; they share the onnxruntime package, so its files are those installed "
                "last: uninstall both and install one")
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
