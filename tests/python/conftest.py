"""Shared fixtures of the Python tests: a private cache directory per test."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Every test tunes into its own AITUNE_CACHE_DIR."""
    path = tmp_path / "aitune-cache"
    monkeypatch.setenv("AITUNE_CACHE_DIR", str(path))
    torch.manual_seed(0)
    return path
