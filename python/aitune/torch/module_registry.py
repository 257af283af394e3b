"""MODULE_REGISTRY: every live ait.Module by name, as AITune's ``aitune.torch.module_registry`` has it."""

from __future__ import annotations

import gc
import weakref
from typing import Any


class ModuleRegistry:
    """Name -> ait.Module, in order of creation; a later module of the same name replaces
    the entry. Entries are weak: a module nobody else holds leaves the registry by itself
    (AITune's registry holds them strongly, so a pipeline tuned in a loop kept every
    earlier pipeline's sessions alive until ``clear()``)."""

    def __init__(self) -> None:
        self._registry: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()

    def register(self, name: str, module: Any) -> None:
        self._registry.pop(name, None)  # re-registering moves the name to the end
        self._registry[name] = module

    def unregister(self, name: str) -> None:
        self._registry.pop(name, None)

    def clear(self) -> None:
        """Forgets every module (the modules themselves are untouched) and collects garbage,
        so sessions of modules nothing else holds are released now."""
        self._registry = weakref.WeakValueDictionary()
        gc.collect()

    @property
    def modules(self) -> dict[str, Any]:
        """A snapshot: name -> ait.Module."""
        return dict(self._registry.items())

    def get(self, name: str) -> Any:
        try:
            return self._registry[name]
        except KeyError:
            raise ValueError(
                f"no ait.Module named '{name}' is registered (registered: {', '.join(map(repr, self._registry)) or 'none'})"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._registry

    def __len__(self) -> int:
        return len(self._registry)


MODULE_REGISTRY = ModuleRegistry()
