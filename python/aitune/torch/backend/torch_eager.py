"""TorchEagerBackend: runs a graph with the wrapped PyTorch module itself.

The last resort of a FirstWinsStrategy: a graph no earlier backend can build still
runs, while the module's other graphs keep their tuned backends. Also what a graph
runs on when performance validation keeps eager.
"""

from __future__ import annotations

import torch

from aitune.torch.backend.base import Backend, TunedGraph
from aitune.torch.graph import RecordedGraph


class EagerGraph(TunedGraph):
    backend_name = "TorchEagerBackend"
    holds_weights = False  # the module itself
    records_attributes = False  # its outputs are the module's own, whatever its attributes

    def __init__(self, graph: RecordedGraph, note: str | None = None):
        self.graph = graph
        self.note = note  # why eager runs, when it was not chosen as a backend

    def infer(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return self.graph.run_eager(inputs)

    def describe(self) -> str:
        return self.backend_name if self.note is None else f"{self.backend_name} ({self.note})"


class TorchEagerBackend(Backend):
    """Eager PyTorch as a strategy's backend. Strategies treat it specially: eager is the
    reference every candidate is measured against, so it needs no candidate of its own."""

    def candidate_count(self, graph: RecordedGraph) -> int:
        return 0
