"""Tune strategies: which backend runs a recorded graph."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from aitune import _core
from aitune.torch.backend.base import Backend, TunedGraph

if TYPE_CHECKING:
    from aitune.torch.graph import RecordedGraph

logger = logging.getLogger("aitune")


class TuningError(_core.AituneError):
    """No backend of a strategy could build a graph; the message lists why each failed."""


class TuneStrategy:
    """Turns a RecordedGraph into a TunedGraph, or raises saying why it cannot."""

    def tune(self, graph: RecordedGraph) -> TunedGraph:
        raise NotImplementedError


class OneBackendStrategy(TuneStrategy):
    """Builds every graph with one backend; its error propagates unchanged (so that,
    e.g., a ProviderUnavailableError keeps its type)."""

    def __init__(self, backend: Backend):
        if not isinstance(backend, Backend):
            raise TypeError(f"backend must be a Backend, got {type(backend).__name__}")
        self.backend = backend

    def tune(self, graph: RecordedGraph) -> TunedGraph:
        try:
            return self.backend.build(graph)
        except Exception as error:
            error.add_note(f"while building {graph.module_name}/{graph.key} with {self.backend.describe()}")
            raise

    def __repr__(self) -> str:
        return f"OneBackendStrategy({self.backend.describe()})"


class FirstWinsStrategy(TuneStrategy):
    """Tries ``backends`` in order; the first that builds and passes its checks wins.
    Each failure is logged; when all fail, a TuningError lists every reason."""

    def __init__(self, backends: Sequence[Backend]):
        backends = list(backends)
        if not backends or not all(isinstance(b, Backend) for b in backends):
            raise TypeError("backends must be a non-empty sequence of Backend instances")
        self.backends = backends

    def tune(self, graph: RecordedGraph) -> TunedGraph:
        reasons = []
        for backend in self.backends:
            try:
                return backend.build(graph)
            except Exception as error:
                reason = f"{backend.describe()}: {type(error).__name__}: {error}"
                logger.warning("%s/%s: %s", graph.module_name, graph.key, reason)
                reasons.append(reason)
                last = error
        raise TuningError(
            f"no backend could build {graph.module_name}/{graph.key}:\n" + "\n".join(f"  - {r}" for r in reasons)
        ) from last

    def __repr__(self) -> str:
        return f"FirstWinsStrategy([{', '.join(b.describe() for b in self.backends)}])"
