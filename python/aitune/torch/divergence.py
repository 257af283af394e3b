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


def _module_values(graph: RecordedGraph, sample: int) -> list[tuple[str, bool, torch.Tensor]]:
    """(module path, is its input, tensor) of every module's first positional input and
    of its output, where that is one floating-point tensor, in the order eager computed
    them (a module's input when it starts, its output when it finishes), on recorded
    sample ``sample``. Inputs narrow the divergence: a module whose input is within
    tolerance and whose output is not holds the fault itself."""
    finished: list[tuple[str, bool, torch.Tensor]] = []
    handles = []
    for name, module in graph.module.named_modules():
        def pre_hook(_module, args, name=name):
            if args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
                finished.append((name, True, args[0].detach().cpu().contiguous()))

        def hook(_module, _args, output, name=name):
            if isinstance(output, torch.Tensor) and output.is_floating_point():
                finished.append((name, False, output.detach().cpu().contiguous()))
        handles.append(module.register_forward_pre_hook(pre_hook))
        handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad(), run_eagerly():
            graph.run_eager(graph.samples[sample].inputs)
    finally:
        for handle in handles:
            handle.remove()
    return finished


def _value_of_scope(model_path: str) -> dict[tuple[str, bool], str]:
    """Per exported module scope, ``(scope, False)``: the first output of the last node (in
    graph order) inside it, the value that module returns; ``(scope, True)``: the first
    value a node inside it reads that a node outside it produced, its input (weights and
    graph inputs have no producer and are not counted)."""
    nodes = _core.onnx_graph_nodes(model_path)
    producer_scopes = {value: set(node.scopes) for node in nodes for value in node.outputs}
    values: dict[tuple[str, bool], str] = {}
    for node in nodes:
        if not node.outputs:
            continue
        for scope in node.scopes:
            values[(scope, False)] = node.outputs[0]
            if (scope, True) not in values:
                outside = [v for v in node.inputs if v in producer_scopes and scope not in producer_scopes[v]]
                if outside:
                    values[(scope, True)] = outside[0]
    return values


def display_path(graph: RecordedGraph, module_path: str) -> str:
    """The user's module path ("model.layers.1.self_attn"); the module itself by its name."""
    return module_path or graph.module_name


def trace_failed_candidates(graph: RecordedGraph, tuner: _core.GraphTuner) -> None:
    """Traces every incorrect ONNX candidate of ``tuner`` (the result lands in its report).
    Tracing is a diagnosis: when it cannot be done (no scope metadata, a graph that will
    not run with extra outputs) the candidate's report says nothing more, and the log why."""
    eager_by_sample: dict[int, list[tuple[str, bool, torch.Tensor]]] = {}
    values_by_model: dict[str, dict[tuple[str, bool], str]] = {}
    for index, candidate in enumerate(tuner.report.candidates):
        if candidate.status != "incorrect":
            continue
        model_path = tuner.model_path(index)
        sample = tuner.first_failing_sample(index)
        if not model_path or sample is None:
            continue
        try:
            if sample not in eager_by_sample:
                eager_by_sample[sample] = _module_values(graph, sample)
            if model_path not in values_by_model:
                values_by_model[model_path] = _value_of_scope(model_path)
            values = values_by_model[model_path]
            eager = []
            for path, is_input, tensor in eager_by_sample[sample]:
                scope = f"{_EXPORT_ROOT}.{path}" if path else _EXPORT_ROOT
                if (scope, is_input) in values:
                    # the scope as node metadata names it (the root module has none there),
                    # so the engine names where the suspect nodes lie as a module path
                    eager.append((display_path(graph, path), values[(scope, is_input)], tensor, scope if path else "",
                                  is_input))
            if not eager:
                logger.info("%s: %s: no module scopes in its graph's metadata to trace the divergence by",
                            graph.module_name, candidate.name)
                continue
            result = json.loads(tuner.trace_divergence(index, sample, eager))
            logger.info("%s: %s: %s", graph.module_name, candidate.name, result["summary"])
        except Exception as error:  # a diagnosis that fails must not hide the tune's own result
            logger.warning("%s: %s: could not trace where it diverges: %s", graph.module_name, candidate.name, error)
