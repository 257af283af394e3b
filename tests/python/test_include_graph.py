"""The C++ include graph runs one way: no `#include "../..."` (an include that climbs out of
its folder), no public header (include/aitune) that includes a private one, and no cycle
between the folders of src/core (folder A includes from B and B from A)."""

from __future__ import annotations

import re
from pathlib import Path

from graph_cycles import find_cycle

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "src" / "core"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _sources(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix in (".hpp", ".cpp", ".h"))


def _quoted_includes(path: Path) -> list[str]:
    return INCLUDE.findall(path.read_text())


def _resolve(includer: Path, name: str) -> Path | None:
    """The src/core file a quoted include names: beside the includer, else from src/core
    (its include root); None for public (aitune/...) or outside headers."""
    for base in (includer.parent, CORE):
        candidate = (base / name).resolve()
        if candidate.is_file() and CORE in candidate.parents:
            return candidate
    return None


def folder_graph() -> dict[str, set[str]]:
    """src/core folder ("." for src/core itself) -> the folders its files include from."""
    graph: dict[str, set[str]] = {}
    for path in _sources(CORE):
        folder = str(path.parent.relative_to(CORE))
        graph.setdefault(folder, set())
        for name in _quoted_includes(path):
            target = _resolve(path, name)
            if target is not None:
                other = str(target.parent.relative_to(CORE))
                if other != folder:
                    graph[folder].add(other)
    return graph


def test_no_include_climbs_out_of_its_folder():
    upward = [f"{p.relative_to(ROOT)}: {n}" for root in (CORE, ROOT / "src" / "cli", ROOT / "include")
              for p in _sources(root) for n in _quoted_includes(p) if ".." in Path(n).parts]
    assert upward == [], "includes that run upward:\n" + "\n".join(upward)


def test_public_headers_include_only_public_headers():
    private = [f"{p.relative_to(ROOT)}: {n}" for p in _sources(ROOT / "include" / "aitune")
               for n in _quoted_includes(p) if not n.startswith("aitune/")]
    assert private == [], "public headers including private ones:\n" + "\n".join(private)


def test_the_folders_of_src_core_form_no_cycle():
    cycle = find_cycle(folder_graph())
    assert cycle is None, "folders of src/core include each other: " + " -> ".join(cycle)
