"""ait.wrap: replace the modules ``ait.inspect`` chose with ait.Modules, in place."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from aitune.torch.dynamic_shapes import DynamicShapes
from aitune.torch.inspection import ModuleInfo
from aitune.torch.module import Module
from aitune.torch.object_paths import MAX_DEPTH, find_modules, replaceable_aliases
from aitune.torch.strategy import TuneStrategy

logger = logging.getLogger("aitune")


def _module_name(info: ModuleInfo, obj: Any) -> str:
    """The ait.Module's name (its cache directory): the object path, or the class name
    for the object itself."""
    return info.object_path or type(obj).__name__


def _inside_others(location, info: ModuleInfo, infos: list[ModuleInfo]) -> bool:
    return any(isinstance(a, torch.nn.Module) and a is other.module and other is not info
               for a in location.ancestors for other in infos)


def _place_outside_others(info: ModuleInfo, infos: list[ModuleInfo]):
    """Where ``info``'s module is wrapped: its first place, or where that one lies inside
    another module being wrapped (whose graph holds it) and the same module sits outside it
    too (a pipeline's ``proj`` that its ``encoder`` also holds, found first as
    ``encoder.proj`` where the encoder is assigned first), that other place: which one
    ait.inspect found first follows the order attributes were assigned in."""
    if not _inside_others(info.location, info, infos):
        return info.location
    outside = replaceable_aliases(info.location, [other.module for other in infos if other is not info])
    return outside[0] if outside else info.location


def wrap(obj: Any, modules: Sequence[ModuleInfo], strategy: TuneStrategy | None = None, strategies=None,
         eager_fallback: bool = False, dynamic_shapes: Mapping[str, Mapping] | None = None,
         harmless_attributes: Mapping[str, Sequence[str]] | None = None) -> Any:
    """Replaces each module of ``modules`` (from ``ait.inspect(...).get_modules()``) with an
    ``ait.Module`` at its place in ``obj``: the attribute of its parent module or plain
    object, the item of its ModuleList / ModuleDict / list / dict. Each is named after its
    object path (``"unet"``, ``"blocks.0"``) and gets ``strategy`` / ``strategies`` and
    ``eager_fallback`` (as ``ait.Module``: once tuned, calls no recorded graph covers, a new
    batch size, sequence length or dtype, run eagerly with a warning instead of raising). A module
    reachable from several places (shared) is replaced by its one wrapper at each of them
    that still holds it, except inside another wrapped module or in a tuple.

    Returns ``obj``; when ``modules`` holds ``obj`` itself (an nn.Module inspected whole),
    returns its wrapper instead; with other modules too (everything else is inside it) it
    refuses, as for any module inside another being wrapped.

    ``dynamic_shapes``: per wrapped module, by its name (the object path, or the class name
    of ``obj`` wrapped whole), the ``dynamic_shapes`` of its ``ait.Module``
    (``{"unet": {"sample": {2: (32, 128), 3: (32, 128)}}}``); a name of no module wrapped is
    a ValueError. ``harmless_attributes``: the same, per wrapped module by name, the
    ``harmless_attributes`` of its ``ait.Module`` (``{"text_encoder": ["calls"]}``).

    Every place is checked first (a place of ``obj``, not of another object inspected; the
    module still there, the place assignable, not wrapped already); on a refusal nothing
    was replaced.
    """
    infos = list(modules)
    if not all(isinstance(info, ModuleInfo) for info in infos):
        raise TypeError("ait.wrap takes the ModuleInfo entries of ait.inspect(...).get_modules()")
    declared = dict(dynamic_shapes or {})
    whole = next((info for info in infos if info.parent is None), None)
    names = [_module_name(whole, obj)] if whole is not None else [_module_name(info, obj) for info in infos]
    harmless = dict(harmless_attributes or {})
    for option, given in (("dynamic_shapes", declared), ("harmless_attributes", harmless)):
        if unknown := sorted(set(map(str, given)) - set(names)):
            raise ValueError(f"ait.wrap: {option} names {', '.join(map(repr, unknown))}, which is not a module "
                             f"wrapped here; the modules are: {', '.join(map(repr, names))}")
    for name, shapes in declared.items():  # malformed: refused before any module is wrapped
        DynamicShapes(shapes)
    for info in infos:
        if info.parent is None:
            if info.module is not obj:
                raise ValueError("a ModuleInfo of another object than obj: inspect obj itself, then wrap its modules")
            others = [other.object_path for other in infos if other is not info]
            if others:  # everything else is inside obj: wrapping obj alone would drop them unsaid
                raise ValueError(f"ait.wrap: '{others[0]}' is inside another module being wrapped (obj itself, "
                                 "object path ''); wrap one of them")
            logger.info("ait.wrap: %s wrapped whole", type(obj).__name__)
            name = _module_name(info, obj)
            return Module(obj, name, strategy, strategies, declared.get(name), eager_fallback=eager_fallback,
                          harmless_attributes=harmless.get(name, ()))
    # every place must be one of obj's: ModuleInfos of another object (ait.inspect of an
    # identical pipeline built twice) would wrap that object's modules, leaving obj as it was
    places = {(id(location.parent), location.key) for _, first in find_modules(obj, max_depth=MAX_DEPTH)
              for location in (first, *first.aliases)}
    for info in infos:
        if (id(info.parent), info.location.key) not in places:
            module = type(info.module)
            raise ValueError(
                f"ait.wrap: '{info.object_path}' (a {module.__module__}.{module.__qualname__}) is not held by the "
                f"{type(obj).__name__} given: its ModuleInfo comes from ait.inspect of another object; inspect this "
                "object, then wrap its modules (nothing was wrapped)")
    plan = []
    for info in infos:
        where = f"ait.wrap: '{info.object_path}'"
        location = _place_outside_others(info, infos)
        current = location.current()
        if isinstance(info.module, Module) or (isinstance(current, Module) and current.ait_module is info.module):
            raise ValueError(f"{where} is an ait.Module already")
        if isinstance(location.parent, tuple):
            raise TypeError(f"{where} is an item of a tuple, which cannot be assigned; hold the modules in a list")
        if current is not info.module:
            raise ValueError(f"{where} no longer holds the inspected {type(info.module).__name__}; inspect again")
        if _inside_others(location, info, infos):
            raise ValueError(f"{where} is inside another module being wrapped; wrap one of them")
        plan.append((info, location))
    wrappers = [Module(info.module, _module_name(info, obj), strategy, strategies,
                       declared.get(_module_name(info, obj)), eager_fallback=eager_fallback,
                       harmless_attributes=harmless.get(_module_name(info, obj), ())) for info, _ in plan]
    inner = [info.module for info, _ in plan]
    for (info, location), wrapped in zip(plan, wrappers):
        if location is not info.location:
            logger.info("ait.wrap: '%s' is inside another module being wrapped, whose graph holds it; wrapped at "
                        "'%s', where the same module is called too", info.object_path, location.path)
        location.replace(wrapped)
        for alias in replaceable_aliases(location, inner):
            if alias.current() is info.module:
                alias.replace(wrapped)
                logger.info("ait.wrap: '%s' holds the same module: the same ait.Module put there", alias.path)
        logger.info("ait.wrap: '%s' (%s) wrapped as ait.Module '%s'", info.object_path, type(info.module).__name__,
                    wrapped.ait_name)
    return obj
