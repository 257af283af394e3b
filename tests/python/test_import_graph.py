"""The Python package's import graph has no cycle: every import of an aitune module by
another (at module level or inside a function) is an edge, and the graph is acyclic."""

from __future__ import annotations

import ast
from pathlib import Path

from graph_cycles import find_cycle

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "python"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((PACKAGE_ROOT / "aitune").rglob("*.py"))}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The aitune module ``name`` names, or its nearest enclosing one (``a.b.C`` -> ``a.b``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    """Module -> the aitune modules it imports. ``from aitune.torch import cache`` is an
    edge to ``aitune.torch.cache`` (a submodule), ``from aitune.torch import Module`` one
    to the package ``aitune.torch``. Importing a submodule runs its packages'
    ``__init__`` first; that is not an edge (a package re-exporting its submodules would
    otherwise be a cycle with each of them)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                resolved = _resolve(target, modules)
                if resolved is not None and resolved != name:
                    graph[name].add(resolved)
    return graph


def test_the_parser_sees_the_front_end():
    graph = import_graph()
    assert "aitune.torch.tuning" in graph
    assert "aitune.torch.context" in graph["aitune.torch.tuning"]  # from aitune.torch.context import ...


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
