"""Cache root resolution and directory layout."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from aitune.torch import cache


def test_cache_root_order(monkeypatch, tmp_path):
    monkeypatch.setenv("AITUNE_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_root() == tmp_path / "explicit"
    monkeypatch.delenv("AITUNE_CACHE_DIR")
    assert cache.cache_root() == tmp_path / "xdg" / "aitune"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_root() == Path(tmp_path / "home" / ".cache" / "aitune")


def test_tune_dir_layout_and_safe_module_names(cache_dir):
    path = cache.tune_dir("my-model", "graph_0123456789ab", "ONNXRuntimeBackend_0011223344556677")
    assert path.parent == cache_dir / "my-model" / "graph_0123456789ab" / "ONNXRuntimeBackend_0011223344556677"
    assert path.is_dir() and path.name.startswith(f"run-{os.getpid()}-")
    assert cache.module_dir("../a/b c").parent == cache_dir  # never escapes the cache
    cache.clear_module("my-model")
    assert path.is_dir()  # this process's run directory is kept: its sessions may be saved
    assert not (cache_dir / "my-model" / "other-graph").exists()


def _tuned(name: str, hidden: int):
    import torch

    import aitune.torch as ait
    from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig

    model = torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 4)).eval()
    backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cpu"))
    module = ait.Module(model, name, strategy=ait.OneBackendStrategy(backend))
    return ait, module, [torch.randn(16) for _ in range(2)]


@pytest.mark.parametrize("limit_kb", [32, 0.5])
def test_cache_on_a_full_file_system_is_an_io_error_naming_the_directory(cache_dir, limit_kb):
    """A cache whose file system refuses the export's bytes (full, over quota: here the
    file size limit, EFBIG) is an AituneIOError naming the cache directory, not an
    ExportError blaming the model's control flow. Half a KB: the tune's config.json, the
    first file of its run directory, is refused (that was a bare OSError)."""
    import resource
    import signal

    import aitune

    ait, module, samples = _tuned("full-disk", 1024)  # ~70 KB of weights
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit_kb * 1024), hard))
    try:
        with pytest.raises(aitune.AituneIOError) as raised:
            ait.tune(module, samples, batch_sizes=[1], ignore_failing_modules=False)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    message = str(raised.value)
    assert str(cache_dir / "full-disk") in message and "File too large" in message, message
    assert "control flow" not in message


def test_cache_path_that_is_a_file_is_an_io_error_naming_it(tmp_path, monkeypatch):
    import aitune

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("AITUNE_CACHE_DIR", str(blocker))
    ait, module, samples = _tuned("blocked", 8)
    with pytest.raises(aitune.AituneIOError, match="not-a-dir") as raised:
        ait.tune(module, samples, batch_sizes=[1], ignore_failing_modules=False)
    assert "AITUNE_CACHE_DIR" in str(raised.value)


_SECOND_USER = """
import sys, torch
import aitune, aitune.torch as ait
from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig
model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).eval()
module = ait.Module(model, "shared", strategy=ait.OneBackendStrategy(
    ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cpu", tune_provider_options=False))))
try:
    ait.tune(module, [torch.randn(16)], batch_sizes=[1], ignore_failing_modules=False)
except aitune.AituneIOError as error:
    print("AituneIOError:", error)
    sys.exit(3)
"""


def test_a_cache_read_only_for_a_second_user_is_an_io_error_saying_what_to_do():
    """A second user tuning a module into a cache the first one made (read-only for it):
    the run directory's refusal said only "cannot create a directory in ...", not that it
    is the cache, nor what to do (AITUNE_CACHE_DIR), unlike every other refusal of the
    cache's location."""
    import subprocess
    import sys
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="aitune-ro-", dir="/tmp"))
    try:
        cache_dir = root / "cache"
        env = {**os.environ, "AITUNE_CACHE_DIR": str(cache_dir), "OMP_NUM_THREADS": "1", "HOME": str(root)}
        first = subprocess.run([sys.executable, "-c", _SECOND_USER], env=env, capture_output=True, text=True,
                               timeout=120)
        assert first.returncode == 0, first.stdout + first.stderr
        second = [sys.executable]
        if os.geteuid() == 0:  # root writes anywhere: the second user is nobody (util-linux's setpriv)
            root.chmod(0o755)
            second = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable]
        else:
            for path in [cache_dir, *cache_dir.rglob("*")]:
                path.chmod(0o555 if path.is_dir() else 0o444)
        done = subprocess.run([*second, "-c", _SECOND_USER], env={**env, "TMPDIR": "/tmp"}, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 3, done.stdout + done.stderr
        assert "aitune cache" in done.stdout and "AITUNE_CACHE_DIR" in done.stdout, done.stdout
        assert str(cache_dir / "shared") in done.stdout and "Permission denied" in done.stdout, done.stdout
    finally:
        for path in [root, *root.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
        shutil.rmtree(root, ignore_errors=True)


def test_the_cache_removed_while_the_export_writes_is_an_io_error_not_the_models_control_flow(cache_dir, monkeypatch):
    """Something removing the cache mid-tune made the exporter's write fail with
    FileNotFoundError, reported as an ExportError whose hint blamed control flow on a
    tensor's value. A file of the export's own directory gone is the cache's problem."""
    import torch

    import aitune

    ait, module, samples = _tuned("removed-mid-export", 8)

    def export_into_a_removed_directory(model, args, f, *rest, **options):
        shutil.rmtree(os.path.dirname(f))
        with open(f, "wb"):
            pass

    monkeypatch.setattr(torch.onnx, "export", export_into_a_removed_directory)
    with pytest.raises(aitune.AituneIOError, match="removed while it was written") as raised:
        ait.tune(module, samples, batch_sizes=[1], ignore_failing_modules=False)
    assert "control flow" not in str(raised.value)
    assert str(cache_dir / "removed-mid-export") in str(raised.value)


def test_a_directory_where_the_tune_report_belongs_is_an_io_error_naming_it(cache_dir):
    """A directory at <cache>/<module>/<graph>/tune_report.json failed the tune, after every
    candidate was measured, with a raw IsADirectoryError."""
    import aitune

    ait, module, samples = _tuned("report-blocked", 8)
    ait.tune(module, samples, batch_sizes=[1], ignore_failing_modules=False)
    (report,) = (cache_dir / "report-blocked").glob("graph_*/tune_report.json")
    report.unlink()
    report.mkdir()
    (report / "keep").write_text("x")
    ait2, again, _ = _tuned("report-blocked", 8)
    with pytest.raises(aitune.AituneIOError, match="the tuning report") as raised:
        ait2.tune(again, samples, batch_sizes=[1], ignore_failing_modules=False)
    assert "tune_report.json" in str(raised.value) and "AITUNE_CACHE_DIR" in str(raised.value)


def test_a_disk_filling_while_the_report_is_written_leaves_no_page_of_the_failed_tune(cache_dir, monkeypatch):
    """The page was put in place before the report was written: a disk that filled on the
    report left tune_report.html, claiming a winner, for a tune that failed, with no JSON."""
    import errno

    import aitune

    ait, module, samples = _tuned("report-full", 8)
    real = Path.write_text

    def full_on_the_report(self, text, *args, **kwargs):
        if self.name == "tune_report.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_on_the_report)
    with pytest.raises(aitune.AituneIOError, match="No space left on device"):
        ait.tune(module, samples, batch_sizes=[1], ignore_failing_modules=False)
    graphs = list((cache_dir / "report-full").glob("graph_*"))
    assert graphs and not [p for g in graphs for p in g.glob("tune_report.*")]
