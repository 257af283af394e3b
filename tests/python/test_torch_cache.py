"""Cache root resolution and directory layout."""

from __future__ import annotations

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


def test_backend_dir_layout_and_safe_module_names(cache_dir):
    path = cache.backend_dir("my-model", "graph_0123456789ab", "ONNXRuntimeBackend_0011223344556677")
    assert path == cache_dir / "my-model" / "graph_0123456789ab" / "ONNXRuntimeBackend_0011223344556677"
    assert path.is_dir()
    assert cache.module_dir("../a/b c").parent == cache_dir  # never escapes the cache
    cache.clear_module("my-model")
    assert not (cache_dir / "my-model").exists()
