"""Tune strategies: plain data naming the backends to try and the rule to choose by. The
driver (graph_tuning.py) reads them; the measuring and choosing is done by the C++ engine
(``aitune._core.GraphTuner``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

from aitune import _core
from aitune.torch.backend.base import Backend
from aitune.torch.options import _check_switches


def _backend_list(backends: Sequence[Backend]) -> list[Backend]:
    if isinstance(backends, Backend):
        raise TypeError("backends must be a non-empty sequence of Backend instances, got one Backend")
    backends = list(backends)
    if not backends or not all(isinstance(b, Backend) for b in backends):
        raise TypeError("backends must be a non-empty sequence of Backend instances")
    return backends


def _describe(backends: Sequence[Backend]) -> str:
    return f"[{', '.join(b.describe() for b in backends)}]"


@dataclasses.dataclass(eq=False)
class TuneStrategy:
    """What the driver reads of a strategy: ``kind`` (the engine's rule), ``backends`` in
    order, ``latency_budget_ms`` (LatencyBudgetStrategy), ``propagate_errors`` (a
    backend's error is raised unchanged instead of being recorded as a failed candidate)
    and ``stop_at_first_success`` (later backends are not tried once one has a correct
    candidate)."""

    kind: ClassVar[_core.StrategyKind]
    propagate_errors: ClassVar[bool] = False
    stop_at_first_success: ClassVar[bool] = False
    backends: list[Backend]

    @property
    def latency_budget_ms(self) -> float:
        return 0.0

    def __post_init__(self) -> None:
        self.backends = _backend_list(self.backends)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({_describe(self.backends)})"

    # AITune's per-strategy switches: they win over ait.tune's options and the process-wide
    # defaults (ait.enable_performance_validation / ait.enable_find_max_batch_size) for the
    # graphs this strategy tunes.

    @property
    def option_overrides(self) -> dict:
        """The TuneOptions fields this strategy sets (empty unless a switch below was used)."""
        return dict(self.__dict__.get("_option_overrides", {}))

    def _override(self, **fields) -> None:
        merged = {**self.option_overrides, **fields}
        _check_switches(merged.get("performance_validation", True), merged.get("min_speedup", 1.01),
                        merged.get("find_max_batch_size", False), merged.get("max_batch_size", 4096))
        self.__dict__["_option_overrides"] = merged

    def enable_performance_validation(self, enabled: bool = True, min_speedup: float = 1.01) -> None:
        """For the graphs this strategy tunes: the winner must beat eager by ``min_speedup``
        (else eager is kept), or, with False, not."""
        self._override(performance_validation=enabled, min_speedup=min_speedup)

    def enable_find_max_batch_size(self, enable: bool = True, max_batch_size: int = 4096) -> None:
        """For the graphs this strategy tunes: search the largest batch the winner takes."""
        self._override(find_max_batch_size=enable, max_batch_size=max_batch_size)


@dataclasses.dataclass(eq=False, repr=False)
class OneBackendStrategy(TuneStrategy):
    """Builds every graph with one backend, the fastest correct of its variants; its
    errors propagate unchanged (a ProviderUnavailableError keeps its type)."""

    kind: ClassVar[_core.StrategyKind] = _core.StrategyKind.ONE_BACKEND
    propagate_errors: ClassVar[bool] = True
    backend: Backend
    backends: list[Backend] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.backend, Backend):
            raise TypeError(f"backend must be a Backend, got {type(self.backend).__name__}")
        self.backends = [self.backend]

    def __repr__(self) -> str:
        return f"OneBackendStrategy({self.backend.describe()})"


@dataclasses.dataclass(eq=False, repr=False)
class FirstWinsStrategy(TuneStrategy):
    """Tries ``backends`` in order; the first with a correct candidate wins (the fastest
    of its variants). Each failure is logged; when all fail, a TuningError lists them."""

    kind: ClassVar[_core.StrategyKind] = _core.StrategyKind.FIRST_WINS
    stop_at_first_success: ClassVar[bool] = True


@dataclasses.dataclass(eq=False, repr=False)
class MaxThroughputStrategy(TuneStrategy):
    """Measures every correct candidate of every backend; the highest throughput wins."""

    kind: ClassVar[_core.StrategyKind] = _core.StrategyKind.MAX_THROUGHPUT


@dataclasses.dataclass(eq=False, repr=False)
class MinLatencyStrategy(TuneStrategy):
    """Measures every correct candidate of every backend; the lowest p50 latency wins."""

    kind: ClassVar[_core.StrategyKind] = _core.StrategyKind.MIN_LATENCY


@dataclasses.dataclass(eq=False, repr=False)
class LatencyBudgetStrategy(TuneStrategy):
    """The highest throughput among candidates whose p50 latency is within
    ``budget_ms``; when none is, the lowest latency (and a warning)."""

    kind: ClassVar[_core.StrategyKind] = _core.StrategyKind.LATENCY_BUDGET
    budget_ms: float

    def __post_init__(self) -> None:
        budget = self.budget_ms
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
            raise ValueError(f"budget_ms must be a positive number, got {budget!r}")
        super().__post_init__()
        self.budget_ms = float(budget)

    @property
    def latency_budget_ms(self) -> float:
        return self.budget_ms

    def __repr__(self) -> str:
        return f"LatencyBudgetStrategy({_describe(self.backends)}, {self.budget_ms} ms)"
