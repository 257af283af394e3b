"""Tune strategies: which backend runs a recorded graph. The measuring and choosing is
done by the C++ engine (``aitune._core.GraphTuner``); a strategy names the backends to
try and the rule to choose by."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from aitune import _core
from aitune.torch.backend.base import Backend, TunedGraph

if TYPE_CHECKING:
    from aitune.torch.graph import RecordedGraph
    from aitune.torch.settings import TuneOptions


class TuningError(_core.AituneError):
    """No backend of a strategy produced a correct candidate; the message lists why each failed."""


class TuneStrategy:
    """Turns a RecordedGraph into a TunedGraph, or raises saying why it cannot.

    Subclasses set ``kind`` and ``backends``. ``propagate_errors``: a backend's error is
    raised unchanged instead of being recorded as a failed candidate. ``stop_at_first_success``:
    later backends are not tried once one has a correct candidate.
    """

    kind: _core.StrategyKind
    backends: list[Backend]
    propagate_errors = False
    stop_at_first_success = False
    latency_budget_ms = 0.0

    def tune(self, graph: RecordedGraph, options: TuneOptions | None = None) -> TunedGraph:
        from aitune.torch.graph_tuning import tune_graph  # the engine driver imports backends

        return tune_graph(self, graph, options)

    def __repr__(self) -> str:
        return f"{type(self).__name__}([{', '.join(b.describe() for b in self.backends)}])"


def _backends(backends: Sequence[Backend]) -> list[Backend]:
    backends = list(backends)
    if not backends or not all(isinstance(b, Backend) for b in backends):
        raise TypeError("backends must be a non-empty sequence of Backend instances")
    return backends


class OneBackendStrategy(TuneStrategy):
    """Builds every graph with one backend, the fastest correct of its variants; its
    errors propagate unchanged (a ProviderUnavailableError keeps its type)."""

    kind = _core.StrategyKind.ONE_BACKEND
    propagate_errors = True

    def __init__(self, backend: Backend):
        if not isinstance(backend, Backend):
            raise TypeError(f"backend must be a Backend, got {type(backend).__name__}")
        self.backend = backend
        self.backends = [backend]

    def __repr__(self) -> str:
        return f"OneBackendStrategy({self.backend.describe()})"


class FirstWinsStrategy(TuneStrategy):
    """Tries ``backends`` in order; the first with a correct candidate wins (the fastest
    of its variants). Each failure is logged; when all fail, a TuningError lists them."""

    kind = _core.StrategyKind.FIRST_WINS
    stop_at_first_success = True

    def __init__(self, backends: Sequence[Backend]):
        self.backends = _backends(backends)


class MaxThroughputStrategy(TuneStrategy):
    """Measures every correct candidate of every backend; the highest throughput wins."""

    kind = _core.StrategyKind.MAX_THROUGHPUT

    def __init__(self, backends: Sequence[Backend]):
        self.backends = _backends(backends)


class MinLatencyStrategy(TuneStrategy):
    """Measures every correct candidate of every backend; the lowest p50 latency wins."""

    kind = _core.StrategyKind.MIN_LATENCY

    def __init__(self, backends: Sequence[Backend]):
        self.backends = _backends(backends)


class LatencyBudgetStrategy(TuneStrategy):
    """The highest throughput among candidates whose p50 latency is within
    ``budget_ms``; when none is, the lowest latency (and a warning)."""

    kind = _core.StrategyKind.LATENCY_BUDGET

    def __init__(self, backends: Sequence[Backend], budget_ms: float):
        if isinstance(budget_ms, bool) or not isinstance(budget_ms, (int, float)) or not budget_ms > 0:
            raise ValueError(f"budget_ms must be a positive number, got {budget_ms!r}")
        self.backends = _backends(backends)
        self.latency_budget_ms = float(budget_ms)

    def __repr__(self) -> str:
        return f"LatencyBudgetStrategy([{', '.join(b.describe() for b in self.backends)}], {self.latency_budget_ms} ms)"
