"""A fresh clone configures without scripts/fetch-onnxruntime.sh having run (a plain
`pip install .`): CMake takes the pinned ONNX Runtime headers from the download cache (or
downloads them), sha256-checked, into the build tree (cmake/AituneOrtHeaders.cmake). Each
test configures a copy of the sources without `.deps` (the configure step only: a few
seconds, nothing compiled, no network: the tarball comes from the cache or a file:// URL)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TARBALL = "com.github.asus4.onnxruntime-0.4.9.tgz"
PINNED_SHA256 = "e59788788818fdde1b2e522e766a21ba0f7d8391de55737abf81e32cc801785d"

#: The header-only dependencies CMake looks up before the ONNX Runtime headers
#: (cmake/AituneDependencies.cmake): without them no configure reaches what is tested here.
HEADER_DEPS = ("nlohmann/json.hpp", "CLI/CLI.hpp", "dlpack/dlpack.h")


def _missing_header_deps() -> list[str]:
    roots = [os.environ.get("AITUNE_DEPS_INCLUDE"), "/usr/include", "/usr/local/include"]
    return [h for h in HEADER_DEPS if not any(r and (Path(r) / h).is_file() for r in roots)]


pytestmark = [
    pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake"),
    pytest.mark.skipif(bool(_missing_header_deps()),
                       reason=f"the header-only dependencies {_missing_header_deps()} are not installed and "
                              "AITUNE_DEPS_INCLUDE does not name them (scripts/setup.sh installs them)"),
]


def _fresh_clone(tmp_path: Path) -> Path:
    """The sources as a fresh clone has them: no .deps, no build trees."""
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".deps", ".venv", "build", "__pycache__", ".gpu", ".whl", "*.so", ".pytest_cache"))
    assert not (source / ".deps").exists()
    return source


def _configure(source: Path, build: Path, cache: Path, *defines: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AITUNE_DOWNLOAD_CACHE": str(cache)}
    # A host without the Debian header-only packages (the GPU host) names where its copies
    # are, as its own build does (scripts/gpu/wheel_session.sh exports AITUNE_DEPS_INCLUDE).
    deps = [f"-DAITUNE_DEPS_INCLUDE={os.environ['AITUNE_DEPS_INCLUDE']}"] if os.environ.get("AITUNE_DEPS_INCLUDE") else []
    return subprocess.run(
        ["cmake", "-S", str(source), "-B", str(build), "-DAITUNE_BUILD_PYTHON=OFF", "-DAITUNE_BUILD_CLI=OFF",
         "-DAITUNE_BUILD_TESTS=OFF", *deps, *defines],
        env=env, capture_output=True, text=True, timeout=300)


def _cached_tarball() -> Path:
    cache = Path(os.environ.get("AITUNE_DOWNLOAD_CACHE") or Path.home() / ".cache" / "aitune" / "downloads")
    tarball = cache / TARBALL
    if not tarball.is_file():
        pytest.skip(f"no {TARBALL} in {cache} (scripts/setup.sh puts it there; tests do not download)")
    return tarball


def test_a_fresh_clone_configures_with_the_pinned_headers_in_its_build_tree(tmp_path):
    tarball = _cached_tarball()
    source, build = _fresh_clone(tmp_path), tmp_path / "build"
    done = _configure(source, build, tarball.parent)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    headers = build / "_deps" / "onnxruntime" / "include"
    assert (headers / "onnxruntime_cxx_api.h").is_file()
    # The pinned headers: the same C API version as scripts/fetch-onnxruntime.sh's.
    assert "#define ORT_API_VERSION 29" in (headers / "onnxruntime_c_api.h").read_text()
    assert not (source / ".deps").exists(), "the source tree stays untouched"
    assert "ONNX Runtime 1.29.0 headers in" in done.stdout


def test_a_download_with_the_wrong_sha256_is_refused_and_leaves_nothing(tmp_path):
    source, build, cache = _fresh_clone(tmp_path), tmp_path / "build", tmp_path / "cache"
    cache.mkdir()
    (cache / TARBALL).write_bytes(b"not the pinned tarball")  # a corrupt cached copy is dropped first
    served = tmp_path / "served.tgz"
    served.write_bytes(b"also not the pinned tarball")
    done = _configure(source, build, cache, f"-DAITUNE_ORT_HEADERS_URL={served.as_uri()}")
    assert done.returncode != 0
    assert f"expected {PINNED_SHA256}" in " ".join(done.stderr.split())
    assert sorted(p.name for p in cache.iterdir()) == [], "no tarball and no .part file stay behind"
    assert not (build / "_deps" / "onnxruntime" / "include").exists()


def test_a_failed_download_names_the_url_and_the_way_out(tmp_path):
    source, build, cache = _fresh_clone(tmp_path), tmp_path / "build", tmp_path / "cache"
    missing = (tmp_path / "nowhere" / "x.tgz").as_uri()
    done = _configure(source, build, cache, f"-DAITUNE_ORT_HEADERS_URL={missing}")
    assert done.returncode != 0
    message = " ".join(done.stderr.split())
    assert f"could not get the ONNX Runtime headers from {missing}: the download failed" in message
    assert "scripts/fetch-onnxruntime.sh" in message
    assert not any(cache.glob("*.part"))


def test_an_ort_root_named_by_the_user_without_headers_is_an_error_not_a_download(tmp_path):
    source, build, empty = _fresh_clone(tmp_path), tmp_path / "build", tmp_path / "empty"
    empty.mkdir()
    done = _configure(source, build, tmp_path / "cache", f"-DAITUNE_ORT_ROOT={empty}",
                      "-DAITUNE_ORT_HEADERS_URL=file:///must/not/be/fetched.tgz")
    assert done.returncode != 0
    assert f"ONNX Runtime headers not found under {empty}/include" in " ".join(done.stderr.split())
    assert "could not get" not in done.stderr


def test_the_cmake_download_and_the_fetch_script_pin_the_same_tarball():
    """Two ways to the same headers (setup.sh's script with npm, and CMake without): one pin."""
    script = (REPO / "scripts" / "fetch-onnxruntime.sh").read_text()
    module = (REPO / "cmake" / "AituneOrtHeaders.cmake").read_text()
    assert f"sha={PINNED_SHA256}" in script
    assert f'set(AITUNE_ORT_HEADERS_SHA256 "{PINNED_SHA256}")' in module
    assert "pkg=com.github.asus4.onnxruntime\nver=0.4.9" in script
    assert f"/{TARBALL}\"" in module
    in_tarball = script.split("headers='", 1)[1].split("'", 1)[0]
    assert f'set(AITUNE_ORT_HEADERS_IN_TARBALL "{in_tarball}")' in module
