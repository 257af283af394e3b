"""Every ```python snippet of docs/onnxruntime-backend.md runs as written (CPU only)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "onnxruntime-backend.md"
SNIPPETS = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


def test_the_guide_has_snippets():
    assert len(SNIPPETS) >= 8


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_snippet_runs(index, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    # Snippets may set AITUNE_CACHE_DIR themselves; monkeypatch restores it afterwards.
    monkeypatch.setenv("AITUNE_CACHE_DIR", str(tmp_path / "cache"))
    code = compile(SNIPPETS[index], f"{DOC.name}[snippet {index}]", "exec")
    exec(code, {"__name__": f"doc_snippet_{index}"})
