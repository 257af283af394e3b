"""Every ```python snippet of the guides runs as written (CPU only)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
#: Extras the guides use that scripts/setup.sh installs but a bare machine may lack.
OPTIONAL_PACKAGES = {"diffusers", "tritonclient", "ray"}
GUIDES = ["onnxruntime-backend.md", "tuning.md", "deploying-triton.md", "pipelines.md"]
SNIPPETS = [
    (guide, i, code)
    for guide in GUIDES
    for i, code in enumerate(re.findall(r"^```python\n(.*?)^```", (DOCS / guide).read_text(), flags=re.S | re.M))
]


def test_the_guides_have_snippets():
    assert sum(1 for guide, _, _ in SNIPPETS if guide == "onnxruntime-backend.md") >= 8
    assert any(guide == "tuning.md" for guide, _, _ in SNIPPETS)
    assert sum(1 for guide, _, _ in SNIPPETS if guide == "deploying-triton.md") >= 3
    assert sum(1 for guide, _, _ in SNIPPETS if guide == "pipelines.md") == 2


@pytest.mark.parametrize("guide, index, code", SNIPPETS, ids=[f"{g}-{i}" for g, i, _ in SNIPPETS])
def test_snippet_runs(guide, index, code, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    # Snippets may set AITUNE_CACHE_DIR themselves; monkeypatch restores it afterwards.
    monkeypatch.setenv("AITUNE_CACHE_DIR", str(tmp_path / "cache"))
    try:
        exec(compile(code, f"{guide}[snippet {index}]", "exec"), {"__name__": f"doc_snippet_{index}"})
    except ModuleNotFoundError as error:
        # An optional extra scripts/setup.sh installs (a GPU machine may lack it): a skip
        # that names it, never a pass.
        if error.name not in OPTIONAL_PACKAGES:
            raise
        pytest.skip(f"{guide} snippet {index} needs {error.name}, which is not installed (scripts/setup.sh installs it)")
