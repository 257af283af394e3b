"""The batching plan of a served checkpoint: its tuning reports' latencies handed to the engine's plan_serving."""
from __future__ import annotations

from aitune import _core

#: The tuning report ait.save keeps beside each graph's model (aitune.torch.checkpoint.REPORT_FILE).
REPORT_FILE = "tune_report.json"


def graph_latencies(checkpoint, key: str) -> list:
    """The winner's measured latency per batch size from graph `key`'s saved report; [] without one."""
    relative = f"{_core.Checkpoint.graph_directory(key)}/{REPORT_FILE}"
    try:
        path = checkpoint.artifact_path(relative)
    except _core.InvalidArgumentError:
        return []
    with open(path, encoding="utf-8") as f:
        return _core.batch_latencies_from_report(f.read())


def batch_limit(spec) -> int:
    """Largest batch the graph accepts (0: unbounded or no batch axis)."""
    limits = [t.max_shape[t.batch_axis] for t in spec.inputs if t.batch_axis is not None]
    limits = [m for m in limits if m >= 0]
    return min(limits) if limits else 0


def plan_for(checkpoint, slo_ms: float | None = None, overhead_ms: float = 2.0, graph: str | None = None):
    """The engine's ServingPlan for the checkpoint's graph (the named one, else the first:
    Ray Serve batches one method with one max_batch_size, so the first graph decides)."""
    key = graph or next((k for k in checkpoint.graph_keys() if checkpoint.runs_in_engine(k)), checkpoint.graph_keys()[0])
    spec = checkpoint.graph(key).graph_spec
    if not any(t.batch_axis is not None for t in spec.inputs):
        # Nothing may be concatenated: every request is a call of its own.
        objective = _core.ServingObjective(slo_ms=slo_ms, overhead_ms=overhead_ms, max_batch_accepted=1)
    else:
        objective = _core.ServingObjective(slo_ms=slo_ms, overhead_ms=overhead_ms, max_batch_accepted=batch_limit(spec),
                                           apart_reason=_core.requests_apart_reason(spec))
    return _core.plan_serving(graph_latencies(checkpoint, key), objective)

