"""TorchEagerBackend: runs a graph with the wrapped PyTorch module itself.

The last resort of a FirstWinsStrategy: a graph no other backend can build still runs,
while the module's other graphs keep their tuned backends.
"""

from __future__ import annotations

import torch

from aitune.torch.backend.base import Backend, TunedGraph
from aitune.torch.graph import RecordedGraph


class _EagerGraph(TunedGraph):
    backend_name = "TorchEagerBackend"

    def __init__(self, graph: RecordedGraph):
        self.graph = graph

    def infer(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return self.graph.run_eager(inputs)


class TorchEagerBackend(Backend):
    def build(self, graph: RecordedGraph) -> TunedGraph:
        return _EagerGraph(graph)
