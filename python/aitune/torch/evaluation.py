"""The user's labelled evaluation set (``ait.tune(..., evaluation=(samples, labels))``): its
batches, recorded with the tuning samples, and the user's metric over them for the engine."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.data import default_collate

from aitune.torch.dataset import _as_call, _stack

logger = logging.getLogger("aitune")


@dataclasses.dataclass(frozen=True)
class EvaluationBatch:
    """One call of the evaluation set: the first ``size`` labelled samples from ``start``,
    stacked on a new axis 0 as ``ait.tune`` stacks its samples."""

    size: int
    args: tuple
    kwargs: dict[str, Any]
    labels: Any  # the batch's labels, collated (numbers and tensors stacked into a tensor)


def evaluation_batches(evaluation: Any, batch_size: int) -> list[EvaluationBatch]:
    """``(samples, labels)`` -> the batches to record, in order: consecutive samples, at
    most ``batch_size`` per batch (the last may be smaller), each with its labels. Samples
    take the forms of ``ait.tune``'s dataset entries (a tensor, a tuple of arguments, a
    dict of keywords), without a batch axis."""
    if not isinstance(evaluation, (tuple, list)) or len(evaluation) != 2:
        raise TypeError(f"evaluation must be a pair (samples, labels), got {type(evaluation).__name__}")
    samples, labels = evaluation
    if isinstance(samples, torch.Tensor) or not isinstance(samples, Sequence) \
            or not (isinstance(labels, Sequence) or isinstance(labels, torch.Tensor)):
        raise TypeError("evaluation=(samples, labels): both must be sequences with one entry per sample "
                        f"(got {type(samples).__name__} and {type(labels).__name__})")
    if len(samples) == 0:
        raise ValueError("evaluation has no samples")
    if len(samples) != len(labels):
        raise ValueError(f"evaluation has {len(samples)} samples but {len(labels)} labels: one label per sample")
    batches = []
    for start in range(0, len(samples), batch_size):
        chunk = list(samples[start:start + batch_size])
        try:
            batch = _stack(chunk)
        except (RuntimeError, ValueError) as error:  # shapes or structures differ within the batch
            raise ValueError(f"evaluation samples {start}..{start + len(chunk) - 1} cannot be stacked into one "
                             f"batch: {error}") from error
        args, kwargs = _as_call(batch)
        batches.append(EvaluationBatch(len(chunk), args, kwargs,
                                       default_collate([labels[i] for i in range(start, start + len(chunk))])))
    return batches


def labelled_metric(graph, samples: list, accuracy: Callable, labels: Sequence) -> Callable | None:
    """The engine's metric callable for ``accuracy(outputs, labels) -> float`` over the
    graph's evaluation calls: ``outputs`` the module's outputs of each evaluation batch
    (as the module returns them), ``labels`` each batch's labels. The engine calls it with
    the reference's outputs (eager's score, the baseline) and with each candidate's, and
    decides by the drop. None, with a warning, where no evaluation batch called this graph
    (another input structure): the graph is then judged by the built-in rules."""
    calls: dict[int, int] = {}  # evaluation batch -> index of its sample in this graph
    for index, recorded in enumerate(graph.samples):
        if recorded.evaluation is None:
            continue
        if recorded.evaluation in calls:
            raise ValueError(f"{graph.module_name}/{graph.key}: evaluation batch {recorded.evaluation} called this "
                             "graph more than once; the labelled metric needs one call of the module per batch")
        calls[recorded.evaluation] = index
    name = f"{graph.module_name}/{graph.key}"
    if not calls:
        logger.warning("%s: no evaluation batch called this graph (another input structure): its candidates are "
                       "judged without the labelled accuracy metric", name)
        return None
    batches = sorted(calls)
    missing = [b for b in range(len(labels)) if b not in calls]
    if missing:
        logger.warning("%s: evaluation batches %s did not call this graph; the labelled metric covers the other %d",
                       name, missing, len(batches))
    indices = [calls[b] for b in batches]
    batch_labels = [labels[b] for b in batches]

    def score(outputs) -> float:
        evaluated = [graph.rebuild_outputs([torch.from_dlpack(c).clone() for c in outputs[i]]) for i in indices]
        return metric_number(accuracy(evaluated, batch_labels))

    return score


def metric_number(value) -> float:
    """The user's ``accuracy`` result as the engine's number; anything else is a TypeError
    (a string is no number, though ``float("1.0")`` reads one)."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"accuracy must return a number, got {type(value).__name__} {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"accuracy must return a number, got {type(value).__name__}") from None
