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
                                           apart_reason=apart_reason(spec))
    return _core.plan_serving(graph_latencies(checkpoint, key), objective)


def apart_reason(spec) -> str:
    """Why requests to the graph may not share a call ("" where they may): the tuner did not
    find each row of a batch computed as it is alone (GraphSpec.batch_rows), so a request
    joined with others could get a part of their answers (the engine's group_requests keeps
    them apart too)."""
    if spec.batch_rows == "independent":
        return ""
    if spec.batch_rows == "coupled":
        return f"the model's batch rows depend on each other ({spec.batch_rows_reason})"
    return ("the tuner did not check that the model computes each row of a batch apart ("
            + (spec.batch_rows_reason or "a checkpoint written before the check") + "); tune it again with a batch of 1 "
            "and one of 2 or more samples (the check runs a row of the largest alone) to serve batches")
