"""Several strategies on one ait.Module: which strategy tunes which recorded graph
(``strategies=`` on ``ait.Module`` and ``ait.wrap``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aitune.torch.strategy import TuneStrategy

#: A key of a ``strategies`` mapping: a graph's index in recording order, a graph key
#: (``graph_<digest>``, stable across runs; ``ait_graphs[i].key`` after a dry run), or a
#: predicate on the recorded graph (its ``input_names``, ``describe()``, samples' shapes).
GraphSelector = int | str | Callable[[Any], bool]


def _selector_name(selector: Any) -> str:
    if callable(selector):
        return getattr(selector, "__qualname__", repr(selector))
    return repr(selector)


class StrategySelection:
    """What ``strategy`` / ``strategies`` said, checked once at construction; asked per
    graph when tuning.

    - ``strategy``: one strategy for every graph.
    - ``strategies`` as a list: graph ``i`` (in order of first call) is tuned by
      ``strategies[i]``; fewer strategies than graphs is an error.
    - ``strategies`` as a mapping ``GraphSelector -> strategy``: each graph is tuned by
      the strategy of the one selector that matches it; a graph no selector (or more
      than one) matches is an error naming the graph.
    """

    def __init__(self, strategy: TuneStrategy | None, strategies: Sequence[TuneStrategy] | Mapping | None,
                 default: Callable[[], TuneStrategy]):
        if strategy is not None and strategies is not None:
            raise ValueError("give either strategy or strategies, not both")
        if strategy is not None and not isinstance(strategy, TuneStrategy):
            raise TypeError(f"strategy must be a TuneStrategy, got {type(strategy).__name__}")
        self.strategy = strategy
        self.strategy_list: list[TuneStrategy] | None = None
        self.strategy_map: dict[Any, TuneStrategy] | None = None
        if strategies is None:
            if strategy is None:
                self.strategy = default()
            return
        if isinstance(strategies, Mapping):
            items = list(strategies.items())
            for selector, value in items:
                if isinstance(selector, bool) or not (isinstance(selector, (int, str)) or callable(selector)):
                    raise TypeError(
                        "a strategies mapping's keys select graphs: an int (index in recording order), a str (graph "
                        f"key) or a callable(graph) -> bool; got {type(selector).__name__} {selector!r}"
                    )
                self._check(value, f"strategies[{_selector_name(selector)}]")
            if not items:
                raise ValueError("strategies is an empty mapping")
            self.strategy_map = dict(items)
        elif isinstance(strategies, (list, tuple)):
            if not strategies:
                raise ValueError("strategies is an empty list")
            for i, value in enumerate(strategies):
                self._check(value, f"strategies[{i}]")
            self.strategy_list = list(strategies)
        else:
            raise TypeError(f"strategies must be a list of TuneStrategy or a mapping, got {type(strategies).__name__}")

    @staticmethod
    def _check(value: Any, where: str) -> None:
        if not isinstance(value, TuneStrategy):
            raise TypeError(f"{where} must be a TuneStrategy, got {type(value).__name__}")

    @property
    def primary(self) -> TuneStrategy:
        """The single strategy, or the first of several (``ait_strategy``)."""
        if self.strategy is not None:
            return self.strategy
        if self.strategy_list is not None:
            return self.strategy_list[0]
        return next(iter(self.strategy_map.values()))

    def for_graphs(self, module_name: str, graphs: list) -> list[TuneStrategy]:
        """The strategy of each graph, in order; raises before anything is tuned when one
        has none."""
        if self.strategy is not None:
            return [self.strategy] * len(graphs)
        if self.strategy_list is not None:
            if len(self.strategy_list) < len(graphs):
                raise ValueError(
                    f"ait.Module '{module_name}' recorded {len(graphs)} graphs but strategies lists "
                    f"{len(self.strategy_list)}; graph i is tuned by strategies[i]. Graphs: "
                    + "; ".join(f"[{i}] {g.key}: {g.describe()}" for i, g in enumerate(graphs))
                )
            return self.strategy_list[: len(graphs)]
        chosen, problems = [], []
        for index, graph in enumerate(graphs):
            matches = [s for s in self.strategy_map if self._matches(s, index, graph)]
            if len(matches) == 1:
                chosen.append(self.strategy_map[matches[0]])
                continue
            why = "no selector matches it" if not matches else \
                f"several selectors match it ({', '.join(map(_selector_name, matches))})"
            problems.append(f"graph [{index}] {graph.key} ({graph.describe()}): {why}")
        if problems:
            raise ValueError(
                f"ait.Module '{module_name}': strategies cannot choose a strategy for every graph: "
                + "; ".join(problems)
                + f". Selectors: {', '.join(map(_selector_name, self.strategy_map))}"
            )
        return chosen

    @staticmethod
    def _matches(selector: Any, index: int, graph: Any) -> bool:
        if isinstance(selector, int):
            return selector == index
        if isinstance(selector, str):
            return selector == graph.key
        return bool(selector(graph))
