"""Cache root resolution and directory layout."""

from __future__ import annotations

import os
from pathlib import Path

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
