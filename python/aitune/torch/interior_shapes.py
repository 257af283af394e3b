"""A check of every candidate at shapes between the recorded ones.

A graph accepts every shape inside the range its samples spanned on a dynamic axis
(an image 32..48 wide), but it is compared with eager only at the recorded shapes. An
export may hold only at those: torch.export decides a model's shape-dependent branches
(Swin pads its windows when the size is not a multiple of the window) on the example and
the ONNX graph keeps no guard, so at 33..47 the graph returns outputs of another shape or
fails inside ONNX Runtime. One more sample, a recorded one cropped on its dynamic axes to
an unrecorded size inside the range (inputs such as token ids, masks, audio and images stay
what they were, only shorter), is checked like the others: a candidate wrong there fails
the tune's checks, with the sample's shapes in the log. Where the export found the branch
(a condition on sizes, ``shape_conditions``) and the crop lands across it, the graph keeps
the condition and refuses the crop's sizes instead: the crop is not run through it. An axis declared in
``dynamic_shapes`` to take extents below the recorded ones is cropped there when the
samples span no range on it (half the shortest recorded extent, within the declared range).
Where forward returns other values that are no tensors (a padding amount, a flag) at the
crop, or at a batch between the recorded ones, the tune is refused: a graph returns the
recorded ones at every size it takes."""

from __future__ import annotations

import logging

import torch

from aitune.torch.context import run_eagerly
from aitune.torch.graph import RecordedGraph

logger = logging.getLogger("aitune")


def probe_indices(graph: RecordedGraph) -> list[int]:
    """The indices in ``graph.samples`` of the samples aitune made itself (the crop): the
    engine's probes (``TuneSample::probe``), never timed, and not run through a graph whose
    shape conditions refuse their sizes (the graph refuses such a call anyway)."""
    index = getattr(graph, "interior_index", None)
    return [] if index is None else [index]


def _fully_padded_row(graph: RecordedGraph, inputs: list[torch.Tensor]) -> bool:
    """Whether an attention mask among ``inputs`` (an integer or bool input named so, [batch,
    sequence]) has a row with no valid position."""
    for name, tensor in zip(graph.input_names, inputs, strict=True):
        if "attention_mask" in name and tensor.dim() == 2 and not tensor.is_floating_point() and tensor.numel():
            if bool((tensor == 0).all(dim=-1).any()):
                return True
    return False


def add_interior_sample(graph: RecordedGraph) -> str | None:
    """Adds the cropped sample to ``graph.samples`` (once per graph) and returns its
    description, or None where the samples span no such range, no recorded sample covers
    the sizes, or the module refuses the cropped call (sizes tied to each other in a way a
    crop breaks). ValueError where the crop's outputs that are no tensors (a number, a
    flag) or their structure differ from the recorded calls': no graph can serve the range."""
    if getattr(graph, "interior_sample", None) is not None or len(graph.samples) < 2:
        return None
    graph.interior_sample = ""
    spec = graph.graph_spec()
    _check_values_between_batches(graph, spec)
    # axes of the inputs that varied, grouped by the sizes they had in each sample: axes that
    # always had the same size (ids and mask of a sequence) are cropped to the same size
    groups: dict[tuple, list[tuple[int, int]]] = {}
    for i, tensor_spec in enumerate(spec.inputs):
        for axis in tensor_spec.dynamic_axes():
            if axis == tensor_spec.batch_axis:
                continue
            sizes = tuple(int(s.inputs[i].shape[axis]) for s in graph.samples)
            groups.setdefault(sizes, []).append((i, axis))
    targets: dict[tuple[int, int], int] = {}
    for sizes, axes in groups.items():
        recorded = set(sizes)
        # an axis declared (dynamic_shapes) with a step takes only min + k * step: crops too
        declared_min = max(spec.inputs[i].min_shape[axis] for i, axis in axes)
        step = max(spec.inputs[i].step_of(axis) for i, axis in axes)

        def on_step(size: int) -> int:
            return size - (size - declared_min) % step

        interior = [on_step(v) for v in (min(recorded) + 1, (min(recorded) + max(recorded)) // 2)]
        interior = [v for v in interior if min(recorded) < v < max(recorded) and v not in recorded]
        # an axis declared to go below what was recorded: checked there too
        below = on_step(max(declared_min, min(recorded) // 2, 1))
        if not interior and declared_min <= below < min(recorded):
            interior = [below]
        if interior:
            for key in axes:
                targets[key] = interior[0]
    if not targets:
        return None
    source = next((s for s in sorted(graph.samples, key=lambda s: -s.batch_size)
                   if s.evaluation is None
                   and all(s.inputs[i].shape[axis] >= size for (i, axis), size in targets.items())), None)
    if source is None:
        return None
    inputs = None
    for from_end in (False, True):
        # The first positions, or the last where that leaves a row with no valid position: a
        # left-padded row (batched prefill) cut to its first positions is all padding, whose
        # outputs no layout leaves out of the check (next-token logits [B, 1, V], a
        # classifier's [B, labels]): every candidate was refused on that undefined row (a
        # session-37 probe).
        cropped = []
        for i, tensor in enumerate(source.inputs):
            for (j, axis), size in targets.items():
                if j == i:
                    tensor = tensor.narrow(axis, tensor.shape[axis] - size if from_end else 0, size)
            cropped.append(tensor.contiguous().clone())
        if not _fully_padded_row(graph, cropped):
            inputs = cropped
            break
    if inputs is None:
        logger.debug("%s/%s: no check between the recorded shapes: every crop leaves a row all padding",
                     graph.module_name, graph.key)
        return None
    args, kwargs = graph.call_arguments(inputs)
    try:
        with torch.no_grad(), run_eagerly():
            outputs = graph.module.forward(*args, **kwargs)
    except Exception as error:  # a crop the module refuses: the recorded shapes are all there is to check
        logger.debug("%s/%s: no check between the recorded shapes: %s: %s", graph.module_name, graph.key,
                     type(error).__name__, error)
        return None
    shapes = ", ".join(f"{graph.input_names[i]} {list(t.shape)}" for i, t in enumerate(inputs)
                       if any(j == i for j, _ in targets))
    if difference := graph.other_outputs(outputs):
        # the outputs that are no tensors (a number, a flag, the structure) differ at the crop:
        # a graph returns the recorded ones at every size of its range, silently wrong there
        raise _other_values(graph, shapes, difference)
    graph.add_sample(inputs, outputs, source.batch_size)
    graph.interior_index = len(graph.samples) - 1
    graph.interior_sample = (f"sample {len(graph.samples) - 1} ({shapes}) is a recorded sample cropped to sizes "
                             "between the recorded ones: a candidate failing there holds only at the recorded shapes")
    return graph.interior_sample


def _check_values_between_batches(graph: RecordedGraph, spec) -> None:
    """The crop leaves the batch axis alone; a batch between the recorded ones (3, recorded
    at 2 and 4) is served by the graph too, so forward runs once at the smallest such batch
    (the largest sample cropped) and its outputs that are no tensors (a flag
    ``x.shape[0] == 3``) must be the recorded ones: ValueError where they differ. Its
    tensors are not kept: a branch on the batch is the export's conditions' to find."""
    axes = [tensor_spec.batch_axis for tensor_spec in spec.inputs]
    recorded = sorted({s.batch_size for s in graph.samples if s.evaluation is None})
    batch = next((b for b in range(recorded[0] + 1, recorded[-1]) if b not in recorded), None) if recorded else None
    if batch is None or all(axis is None for axis in axes):
        return
    source = next(s for s in graph.samples if s.evaluation is None and s.batch_size == recorded[-1])
    inputs = [(t if axis is None else t.narrow(axis, 0, batch)).contiguous().clone()
              for t, axis in zip(source.inputs, axes, strict=True)]
    args, kwargs = graph.call_arguments(inputs)
    try:
        with torch.no_grad(), run_eagerly():
            outputs = graph.module.forward(*args, **kwargs)
    except Exception as error:  # a batch the module refuses: nothing to compare
        logger.debug("%s/%s: no check at batch %d: %s: %s", graph.module_name, graph.key, batch,
                     type(error).__name__, error)
        return
    if difference := graph.other_outputs(outputs):
        shapes = ", ".join(f"{name} {list(t.shape)}" for name, t, axis in zip(graph.input_names, inputs, axes,
                                                                               strict=True) if axis is not None)
        raise _other_values(graph, shapes, difference)


def _other_values(graph: RecordedGraph, shapes: str, difference: str) -> ValueError:
    """Forward, called at ``shapes`` between the recorded ones, returned outputs whose values
    that are no tensors (a number, a flag) or structure differ from the recorded calls'
    (``difference``: ``RecordedGraph.other_outputs``)."""
    return ValueError(
        f"ait.Module '{graph.module_name}' {graph.key}: called at sizes between the recorded ones ({shapes}), "
        f"forward returns outputs other than at the recorded sizes ({difference}); a graph takes every size in "
        "the recorded range and returns the recorded values of outputs that are no tensors, so it would return "
        "them there, silently wrong. Return such a value as a tensor, or compute it from the input's shape "
        "outside the module"
    )
