"""docs/architecture.md matches the tree: every file and folder it names exists, every
public header and every folder of src/ is described there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text()
# Where a bare name in the doc is looked for (the doc names files by their concept's folder).
SEARCHED = [ROOT / "src", ROOT / "include", ROOT / "python", ROOT / "tests", ROOT / "docs"]
SOURCE = re.compile(r"^[\w./<>-]*?[\w-]+(\.\{[\w,]+\}|\.(?:hpp|cpp|py|md))$")


def _named() -> set[str]:
    """Every backticked token that names a source file or a folder, braces expanded."""
    names = set()
    for token in re.findall(r"`([^`\s]+)`", DOC):
        if "<" in token or token.startswith(("aitune.", "_core.")):
            continue  # a pattern (<cache>/...) or a Python object
        if token.endswith("/") or SOURCE.match(token):
            brace = re.match(r"(.*)\.\{([\w,]+)\}$", token)
            names.update(f"{brace[1]}.{ext}" for ext in brace[2].split(",")) if brace else names.add(token)
    return names


def _exists(name: str) -> bool:
    if (ROOT / name).exists():
        return True
    stripped = name.rstrip("/")
    return any(p.relative_to(base).as_posix().endswith(stripped)
               for base in SEARCHED for p in base.rglob(Path(stripped).name))


def test_the_doc_names_files_and_folders():
    assert len(_named()) > 60


def test_every_file_and_folder_it_names_exists():
    missing = sorted(n for n in _named() if not _exists(n))
    assert missing == [], f"docs/architecture.md names what does not exist: {missing}"


def test_every_public_header_is_described():
    headers = sorted(p.name for p in (ROOT / "include" / "aitune").glob("*.hpp"))
    undescribed = [h for h in headers if f"`{h}`" not in DOC and not re.search(rf"`aitune/{re.escape(h)}`", DOC)]
    assert undescribed == [], f"public headers docs/architecture.md does not describe: {undescribed}"


def test_every_src_folder_is_described():
    folders = sorted({p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "src").rglob("*.cpp")})
    undescribed = [f for f in folders if f"`{f}/`" not in DOC and f"{f}/" not in DOC]
    assert undescribed == [], f"src/ folders docs/architecture.md does not describe: {undescribed}"


def test_the_checker_sees_a_missing_file():
    assert not _exists("no_such_file.cpp")
    assert _exists("tuner.cpp") or _exists("tuning/tuner.cpp")
