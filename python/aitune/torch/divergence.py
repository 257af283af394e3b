"""Where a candidate that failed the check first diverges, named as the user's module
path: eager PyTorch's module outputs (forward hooks) on the sample it failed, mapped to
the ONNX values the exporter's scope metadata says those modules produced; the engine
(``GraphTuner.trace_divergence``) runs the candidate's graph with those values as outputs
and compares them in the order the modules finished."""

from __future__ import annotations

import json
import logging

import torch

from aitune import _core
from aitune.torch.context import run_eagerly
from aitune.torch.graph import RecordedGraph

logger = logging.getLogger("aitune")

# The exporter sees the user's module as the attribute ``inner`` of export._FlatModule, so
# its scopes read "inner", "inner.layers.1", ...
_EXPORT_ROOT = "inner"


def _module_outputs(graph: RecordedGraph, sample: int) -> list[tuple[str, torch.Tensor]]:
    """(module path, output) of every module whose output is one tensor, in the order the
    modules finished, on recorded sample ``sample``."""
    finished: list[tuple[str, torch.Tensor]] = []
    handles = []
    for name, module in graph.module.named_modules():
        def hook(_module, _args, output, name=name):
            if isinstance(output, torch.Tensor) and output.is_floating_point():
                finished.append((name, output.detach().cpu().contiguous()))
        handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad(), run_eagerly():
            graph.run_eager(graph.samples[sample].inputs)
    finally:
        for handle in handles:
            handle.remove()
    return finished


def _value_of_scope(model_path: str) -> dict[str, str]:
    """Per exported module scope, the first output of the last node (in graph order)
    inside it: the value that module returns."""
    last: dict[str, str] = {}
    for node in _core.onnx_graph_nodes(model_path):
        if not node.outputs:
            continue
        for scope in node.scopes:
            last[scope] = node.outputs[0]
    return last


def display_path(graph: RecordedGraph, module_path: str) -> str:
    """The user's module path ("model.layers.1.self_attn"); the module itself by its name."""
    return module_path or graph.module_name


def trace_failed_candidates(graph: RecordedGraph, tuner: _core.GraphTuner) -> None:
    """Traces every incorrect ONNX candidate of ``tuner`` (the result lands in its report).
    Tracing is a diagnosis: when it cannot be done (no scope metadata, a graph that will
    not run with extra outputs) the candidate's report says nothing more, and the log why."""
    eager_by_sample: dict[int, list[tuple[str, torch.Tensor]]] = {}
    values_by_model: dict[str, dict[str, str]] = {}
    for index, candidate in enumerate(tuner.report.candidates):
        if candidate.status != "incorrect":
            continue
        model_path = tuner.model_path(index)
        sample = tuner.first_failing_sample(index)
        if not model_path or sample is None:
            continue
        try:
            if sample not in eager_by_sample:
                eager_by_sample[sample] = _module_outputs(graph, sample)
            if model_path not in values_by_model:
                values_by_model[model_path] = _value_of_scope(model_path)
            values = values_by_model[model_path]
            eager = []
            for path, tensor in eager_by_sample[sample]:
                scope = f"{_EXPORT_ROOT}.{path}" if path else _EXPORT_ROOT
                if scope in values:
                    # the scope as node metadata names it (the root module has none there),
                    # so the engine names where the suspect nodes lie as a module path
                    eager.append((display_path(graph, path), values[scope], tensor, scope if path else ""))
            if not eager:
                logger.info("%s: %s: no module scopes in its graph's metadata to trace the divergence by",
                            graph.module_name, candidate.name)
                continue
            result = json.loads(tuner.trace_divergence(index, sample, eager))
            logger.info("%s: %s: %s", graph.module_name, candidate.name, result["summary"])
        except Exception as error:  # a diagnosis that fails must not hide the tune's own result
            logger.warning("%s: %s: could not trace where it diverges: %s", graph.module_name, candidate.name, error)
