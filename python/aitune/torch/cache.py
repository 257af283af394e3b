"""Where tuning artefacts live: <cache>/<module>/<graph>/<backend key>/."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path


def cache_root() -> Path:
    """``$AITUNE_CACHE_DIR``, else ``$XDG_CACHE_HOME/aitune``, else ``~/.cache/aitune``."""
    if os.environ.get("AITUNE_CACHE_DIR"):
        return Path(os.environ["AITUNE_CACHE_DIR"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "aitune"
    return Path.home() / ".cache" / "aitune"


def _safe(name: str) -> str:
    """A module name as one directory name (``my-model`` stays, ``a/b`` becomes ``a_b``)."""
    return re.sub(r"[^0-9A-Za-z._-]", "_", name).lstrip(".") or "_"


def module_dir(module_name: str) -> Path:
    return cache_root() / _safe(module_name)


def backend_dir(module_name: str, graph_key: str, backend_key: str) -> Path:
    """The directory of one backend's artefacts for one graph, created if missing."""
    path = module_dir(module_name) / graph_key / backend_key
    path.mkdir(parents=True, exist_ok=True)
    return path


def clear_module(module_name: str) -> None:
    shutil.rmtree(module_dir(module_name), ignore_errors=True)
