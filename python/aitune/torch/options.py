"""TuneOptions: everything ``ait.tune`` hands the driver besides the strategy, the
reference's process-wide switches included (as the defaults of new TuneOptions)."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from aitune import _core
from aitune.torch.valid_positions import check_option as check_valid_positions


@dataclasses.dataclass
class _Defaults:
    """The defaults ``ait.enable_performance_validation`` / ``ait.enable_find_max_batch_size``
    set: what a TuneOptions gets for the fields it is not given. The driver reads only
    the TuneOptions it is handed, never these."""

    performance_validation: bool = True
    min_speedup: float = 1.01
    find_max_batch_size: bool = False
    max_batch_size: int = 4096


_defaults = _Defaults()


def _check_switches(performance_validation, min_speedup, find_max_batch_size, max_batch_size) -> None:
    if not isinstance(performance_validation, bool):
        raise TypeError(f"enabled must be a bool, got {performance_validation!r}")
    if isinstance(min_speedup, bool) or not isinstance(min_speedup, (int, float)) or not min_speedup > 0:
        raise ValueError(f"min_speedup must be > 0, got {min_speedup!r}")
    if not isinstance(find_max_batch_size, bool):
        raise TypeError(f"enabled must be a bool, got {find_max_batch_size!r}")
    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise ValueError(f"max_batch_size must be a positive int, got {max_batch_size!r}")


def enable_performance_validation(enabled: bool = True, min_speedup: float = 1.01) -> None:
    """A tuned candidate must beat eager PyTorch by ``min_speedup`` (p50 latency ratio),
    else the graph keeps running eagerly. On by default. Sets the default of later
    ``ait.tune`` calls; one call can say otherwise (``ait.tune(..., performance_validation=)``)."""
    _check_switches(enabled, min_speedup, False, 1)
    _defaults.performance_validation = enabled
    _defaults.min_speedup = float(min_speedup)


def enable_find_max_batch_size(enabled: bool = True, max_batch_size: int = 4096) -> None:
    """After choosing, double the batch above the largest recorded one until throughput
    grows by less than 5 % (or memory runs out, or ``max_batch_size``), and accept
    batches up to the largest that ran and matched eager. Off by default. Sets the default
    of later ``ait.tune`` calls (``ait.tune(..., find_max_batch_size=)`` for one call)."""
    _check_switches(True, 1.0, enabled, max_batch_size)
    _defaults.find_max_batch_size = enabled
    _defaults.max_batch_size = max_batch_size


def performance_validation_enabled() -> bool:
    """The default set by ``enable_performance_validation``."""
    return _defaults.performance_validation


def find_max_batch_size_enabled() -> bool:
    """The default set by ``enable_find_max_batch_size``."""
    return _defaults.find_max_batch_size


def _tolerance(value, what: str) -> _core.Tolerance:
    try:
        atol, rtol = value
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be an (atol, rtol) pair of numbers, got {value!r}") from None
    # numbers, not what float() also takes: "1e-3" or True is no tolerance a user means
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in (atol, rtol)):
        raise ValueError(f"{what} must be an (atol, rtol) pair of numbers, got {value!r}")
    atol, rtol = float(atol), float(rtol)
    if math.isnan(atol) or math.isnan(rtol):  # every comparison with NaN is false: every element would pass
        raise ValueError(f"{what} must not be NaN, got {value!r}")
    if math.isinf(atol) or math.isinf(rtol):  # an infinite bound passes every element as NaN would
        raise ValueError(f"{what} must be finite (an infinite bound passes any output), got {value!r}")
    if atol < 0 or rtol < 0:
        raise ValueError(f"{what} must not be negative, got {value!r}")
    return _core.Tolerance(atol, rtol)


@dataclasses.dataclass
class TuneOptions:
    """What ``ait.tune`` passes to the driver with every strategy.

    Attributes:
        tolerance: ``(atol, rtol)`` for every output, replacing the defaults by dtype and
            candidate precision.
        output_tolerances: ``{output name: (atol, rtol)}``, winning over ``tolerance``.
        profile: how latency is measured (``aitune._core.ProfileConfig``); None: defaults.
        progress: show a progress bar (tqdm, on a terminal).
        performance_validation, min_speedup: the winner must beat eager's p50 by
            ``min_speedup``, else eager is kept (default: ``ait.enable_performance_validation``).
        find_max_batch_size, max_batch_size: search the largest batch the winner takes
            (default: ``ait.enable_find_max_batch_size``).
        accuracy_factor: calibrated acceptance: a candidate computing in TF32 / fp16 /
            bf16 passes an output the tolerance table fails when its error is at most this
            factor x eager PyTorch's own error at that precision (default 2; >= 1).
        accuracy, max_accuracy_drop: the user's metric, which then decides alone:
            ``accuracy(eager_outputs, candidate_outputs) -> float`` (each a list over
            samples of the module's outputs, higher is better); a candidate passes when
            ``accuracy(eager, eager) - accuracy(eager, candidate) <= max_accuracy_drop``.
        evaluation_labels: set by ``ait.tune(..., evaluation=(samples, labels))``: per
            evaluation batch its labels; ``accuracy`` is then ``accuracy(outputs, labels)``
            over the graph's evaluation calls (evaluation.py).
        valid_positions: which output positions the check compares (``valid_positions.py``):
            None derives them from an ``attention_mask`` argument, False compares all.
    """

    tolerance: tuple[float, float] | None = None
    output_tolerances: Mapping[str, tuple[float, float]] | None = None
    profile: _core.ProfileConfig | None = None
    progress: bool = True
    performance_validation: bool = dataclasses.field(default_factory=lambda: _defaults.performance_validation)
    min_speedup: float = dataclasses.field(default_factory=lambda: _defaults.min_speedup)
    find_max_batch_size: bool = dataclasses.field(default_factory=lambda: _defaults.find_max_batch_size)
    max_batch_size: int = dataclasses.field(default_factory=lambda: _defaults.max_batch_size)
    accuracy_factor: float = 2.0
    accuracy: Callable | None = None
    max_accuracy_drop: float = 0.0
    valid_positions: Any = None
    #: The labels of each labelled evaluation batch (``ait.tune(..., evaluation=...)``,
    #: evaluation.py): ``accuracy`` is then ``accuracy(outputs, labels)`` over those batches.
    evaluation_labels: list | None = None

    def __post_init__(self) -> None:
        _check_switches(self.performance_validation, self.min_speedup, self.find_max_batch_size, self.max_batch_size)
        check_valid_positions(self.valid_positions)
        if self.output_tolerances is not None and not isinstance(self.output_tolerances, Mapping):
            # a list of pairs raised AttributeError: 'list' object has no attribute 'items' (a probe)
            raise TypeError(f"output_tolerances must be a dict {{output name: (atol, rtol)}}, got "
                            f"{type(self.output_tolerances).__name__}: {self.output_tolerances!r:.100}")
        if isinstance(self.accuracy_factor, bool) or not isinstance(self.accuracy_factor, (int, float)) \
                or not 1 <= self.accuracy_factor < float("inf"):
            raise ValueError(f"accuracy_factor must be a finite number >= 1, got {self.accuracy_factor!r}")
        if self.accuracy is not None and not callable(self.accuracy):
            raise TypeError(f"accuracy must be a callable (eager_outputs, candidate_outputs) -> float, "
                            f"got {type(self.accuracy).__name__}")
        if isinstance(self.max_accuracy_drop, bool) or not isinstance(self.max_accuracy_drop, (int, float)) \
                or not self.max_accuracy_drop >= 0:
            raise ValueError(f"max_accuracy_drop must be a number >= 0, got {self.max_accuracy_drop!r}")
        if self.max_accuracy_drop != 0 and self.accuracy is None:
            # without a metric nothing applies it: the built-in rules would decide, unknown to the user
            raise ValueError(f"max_accuracy_drop={self.max_accuracy_drop!r} is given without accuracy: it bounds the "
                             "drop of the user's metric (accuracy=fn), which alone then decides; pass accuracy too, "
                             "or tolerance / output_tolerances / accuracy_factor for the built-in rules")

    def tuner_options(self) -> _core.TunerOptions:
        options = _core.TunerOptions()
        if self.profile is not None:
            if not isinstance(self.profile, _core.ProfileConfig):
                raise TypeError(f"profile must be an aitune._core.ProfileConfig, got {type(self.profile).__name__}")
            self.profile.validate()
            options.profile = self.profile
        if self.tolerance is not None:
            options.tolerance = _tolerance(self.tolerance, "tolerance")
        if self.output_tolerances:
            options.output_tolerances = {
                str(name): _tolerance(value, f"output_tolerances[{name!r}]")
                for name, value in self.output_tolerances.items()
            }
        options.accuracy_factor = float(self.accuracy_factor)
        options.max_accuracy_drop = float(self.max_accuracy_drop)
        options.find_max_batch_size = self.find_max_batch_size
        options.max_batch_size = self.max_batch_size
        return options

    def strategy_config(self, kind: _core.StrategyKind, latency_budget_ms: float = 0.0) -> _core.StrategyConfig:
        return _core.StrategyConfig(
            kind,
            latency_budget_ms=latency_budget_ms,
            performance_validation=self.performance_validation,
            min_speedup=float(self.min_speedup),
        )
