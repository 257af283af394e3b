"""Where the nn.Modules of a pipeline live: object paths (``"unet"``, ``"blocks.0"``) found
by walking an object (nn.Module children, attributes of plain objects, lists, tuples,
dicts), and putting a module back at its place. Used by ait.inspect, ait.wrap, and
saving / loading whole pipelines."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from aitune.torch.flatten import slot_names
from aitune.torch.module import Module


@dataclasses.dataclass(eq=False)
class ModuleLocation:
    """Where a module sits: ``parent[key]`` or ``parent.key``; ``path`` joins the keys
    from the walked object with dots (``""``: the object itself); ``ancestors`` are the
    nn.Modules on the way there (outermost first)."""

    path: str
    parent: Any
    key: str | int | None
    ancestors: tuple = ()
    #: the other places the same module was found at, after this first one (a module
    #: shared by two attributes of a pipeline); filled by ``find_modules``
    aliases: list = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return "" if self.key is None else str(self.key)

    def replace(self, value: Any) -> None:
        """Puts ``value`` where the module is. TypeError where that place cannot be
        assigned (a tuple item, the walked object itself)."""
        parent, key = self.parent, self.key
        if parent is None:
            raise TypeError("the object itself has no parent to put a module into; use the returned value")
        if isinstance(parent, torch.nn.Module):
            setattr(parent, str(key), value)  # registers it among the parent's children
        elif isinstance(parent, (list, dict)):
            parent[key] = value
        elif isinstance(parent, tuple):
            raise TypeError(f"'{self.path}' is an item of a tuple, which cannot be assigned; hold it in a list")
        else:
            setattr(parent, key, value)

    def current(self) -> Any:
        """What is at this place now."""
        parent, key = self.parent, self.key
        if parent is None:
            raise TypeError("the object itself has no parent")
        if isinstance(parent, torch.nn.Module):
            return getattr(parent, str(key), None)
        if isinstance(parent, (list, tuple)):
            return parent[key] if isinstance(key, int) and key < len(parent) else None
        if isinstance(parent, dict):
            return parent.get(key)
        return getattr(parent, key, None)


def _dict_item_has_path(key: Any, names: set[str]) -> bool:
    """Whether a dict item gets an object path: str keys without dots, and ints
    (``{0: controlnet}``, path ``"models.0"``); an int whose name a str key has already
    does not (``names``: the names given so far)."""
    return (isinstance(key, str) and "." not in key or type(key) is int) and str(key) not in names


def _children(obj: Any, skipped: list | None = None) -> Iterator[tuple[str | int, Any]]:
    """The items of ``obj`` that have an object path; ``skipped`` (when given) collects
    ``(key, value)`` of the dict items that have none."""
    if isinstance(obj, torch.nn.Module):
        # registered children (an ait.Module shares its wrapped module's), then modules a
        # module keeps in plain lists, tuples or dicts (not registered as children)
        yield from obj._modules.items()
        for key, value in vars(obj).items():
            if not key.startswith("_") and isinstance(value, (list, tuple, dict)):
                yield key, value
    elif isinstance(obj, (list, tuple)):
        yield from enumerate(obj)
    elif isinstance(obj, dict):
        names: set[str] = set()
        for key, value in obj.items():
            # other keys have no dotted path (``skipped``: ait.save names what they hold)
            if _dict_item_has_path(key, names):
                names.add(str(key))
                yield key, value
            elif skipped is not None:
                skipped.append((key, value))
    elif type(obj).__module__ != "builtins" and (hasattr(obj, "__dict__") or slot_names(type(obj))):
        if isinstance(getattr(obj, "__dict__", None), dict):
            for key, value in vars(obj).items():
                if not key.startswith("__"):
                    yield key, value
        # a pipeline class with ``__slots__`` holds its modules there, not in a __dict__ (it
        # was "holds no torch.nn.Module", and ait.save found no ait.Module a tune had tuned)
        for key in slot_names(type(obj)):
            if not key.startswith("__") and hasattr(obj, key):
                yield key, getattr(obj, key)


_LEAF_TYPES = (str, bytes, int, float, bool, type(None), torch.Tensor, type)

#: How deep ait.save and ait.load look for ait.Modules (and the most ait.inspect may be
#: given): deeper than anything ait.inspect can wrap, so a wrapped module is never left
#: out of a checkpoint.
MAX_DEPTH = 64


def find_modules(obj: Any, max_depth: int = 8,
                 unaddressable: list | None = None) -> list[tuple[torch.nn.Module, ModuleLocation]]:
    """Every nn.Module reachable from ``obj`` (``obj`` itself first, when it is one), each
    once, at the first place found (depth-first, in attribute / index order); the other
    places the same module is found at are that location's ``aliases``. ``unaddressable``
    (when given) collects ``(description, value)`` of the dict items on the way that have no
    object path and are not walked (``"heads['v1.2']"``)."""
    found: list[tuple[torch.nn.Module, ModuleLocation]] = []
    seen: set[int] = set()
    first: dict[int, ModuleLocation] = {}

    def walk(value: Any, location: ModuleLocation, depth: int) -> None:
        if depth > max_depth or isinstance(value, _LEAF_TYPES) or callable(value) and not isinstance(
                value, torch.nn.Module) and not hasattr(value, "__dict__") and not slot_names(type(value)):
            return
        if id(value) in seen:
            if id(value) in first and location.parent is not None:
                first[id(value)].aliases.append(location)
            return
        seen.add(id(value))
        ancestors = location.ancestors
        if isinstance(value, torch.nn.Module):
            found.append((value, location))
            first[id(value)] = location
            ancestors = (*ancestors, value)
        skipped = None if unaddressable is None else []
        for key, child in _children(value, skipped):
            path = f"{location.path}.{key}" if location.path else str(key)
            walk(child, ModuleLocation(path, value, key, ancestors), depth + 1)
        if skipped:
            unaddressable.extend((f"{location.path or '(the object)'}[{key!r}]", item) for key, item in skipped)

    walk(obj, ModuleLocation("", None, None), 0)
    return found


def replaceable_aliases(location: ModuleLocation, wrapped: list[torch.nn.Module]) -> list[ModuleLocation]:
    """The aliases of ``location`` where an ait.Module can stand in for the module too: not
    inside a module of ``wrapped`` (that one's graph holds the module already) or inside an
    ait.Module, not a tuple item."""
    return [alias for alias in location.aliases
            if not isinstance(alias.parent, tuple)
            and not any(isinstance(a, Module) or any(a is w for w in wrapped) for a in alias.ancestors)]


def find_ait_modules(obj: Any, max_depth: int = MAX_DEPTH) -> list[tuple[Any, ModuleLocation]]:
    """The ait.Modules reachable from ``obj``, with their places."""
    return [(module, location) for module, location in find_modules(obj, max_depth) if isinstance(module, Module)]

