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


@pytest.fixture(autouse=True)
def no_performance_validation():
    """Tests of what a backend builds must not depend on whether it beats eager on this
    machine; tests of performance validation switch it on themselves."""
    import aitune.torch as ait

    ait.enable_performance_validation(False)
    yield
    ait.enable_performance_validation(True)
    ait.enable_find_max_batch_size(False)
