"""The dataset forms ait.tune accepts, turned into calls ``(batch_size, args, kwargs)``.

Forms: a tensor (one sample); a sequence or map-style Dataset of samples; any other
iterable of samples; a DataLoader (re-batched per batch size when it batches samples
itself); an ``ait.DataLoaderFactory`` (a dataset with its own collate function); a
factory ``batch_size -> iterable of batches``. A sample is a tensor, a tuple
or list (positional arguments), a dict (keyword arguments), or ``(args, kwargs)``.
Samples have no batch axis: ``batch_size`` samples of equal shape are stacked on a new
axis 0, so recording with several batch sizes reveals each tensor's batch axis.
Samples that hold no tensor at all (a pipeline's prompts, ``{"prompt": "a cat"}``) are
batched as AITune's collator batches them: each string becomes the list of the batch's
strings (``["a cat", "a dog"]``); where samples hold tensors, strings are constants.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree
from torch.utils.data import DataLoader, Dataset

from aitune.torch.context import mark_owned_batch


def _plain(sample: Any) -> Any:
    """A sample or batch whose keyword arguments come in a mapping that is not a dict
    (a Hugging Face ``BatchEncoding``, any ``UserDict``), with that mapping made a dict.

    Such a mapping is unknown to pytree, so it would be one opaque leaf: never stacked
    into a batch, its tensors invisible. Its keys are keyword arguments either way
    (``_as_call`` unpacks it), so nothing the forward sees changes."""
    if isinstance(sample, Mapping) and not isinstance(sample, dict):
        return dict(sample)
    if (isinstance(sample, (tuple, list)) and len(sample) == 2 and isinstance(sample[0], (tuple, list))
            and isinstance(sample[1], Mapping) and not isinstance(sample[1], dict)):
        return type(sample)((sample[0], dict(sample[1])))
    return sample


def _check_stackable(leaf: Any) -> None:
    """A non-tensor leaf must be a constant: a mapping pytree cannot open that holds
    tensors (a ``BatchEncoding`` inside a sample) would be compared, not stacked, and its
    tensors left without a batch axis."""
    if isinstance(leaf, Mapping) and any(isinstance(v, (torch.Tensor, np.ndarray)) for v in leaf.values()):
        raise ValueError(
            f"a sample holds tensors inside a {type(leaf).__module__}.{type(leaf).__qualname__}, which cannot be "
            "stacked into a batch; pass them in a dict, tuple, list or dataclass instead"
        )


def _holds_tensor(leaves: list[Any]) -> bool:
    return any(isinstance(leaf, (torch.Tensor, np.ndarray)) for leaf in leaves)


def _stack(samples: list[Any]) -> Any:
    """One batch from ``samples``: tensors stacked on a new axis 0, other values kept
    (they must be equal across the samples: they are constants of the graph). Samples
    that hold no tensor (prompts) make each string the list of the batch's strings, as
    AITune's collator does: kept as one string, a batch of b prompts would be one prompt,
    and the pipeline would run (and be tuned) at batch 1 under every batch size."""
    samples = [_plain(sample) for sample in samples]
    flat = [pytree.tree_flatten(sample) for sample in samples]
    spec = flat[0][1]
    if any(s != spec for _, s in flat):
        raise ValueError(f"samples of one batch differ in structure: {spec} vs {next(s for _, s in flat if s != spec)}")
    strings_batched = not any(_holds_tensor(leaves) for leaves, _ in flat)
    leaves = []
    for column in zip(*(leaves for leaves, _ in flat)):
        first = column[0]
        if strings_batched and all(isinstance(v, str) for v in column):
            leaves.append(list(column))
            continue
        if len(column) == 1 and isinstance(first, torch.Tensor) and not first.requires_grad:
            # A batch of one is a view of the sample, kept by the recording without a
            # copy (ait.tune refuses to tune when the sample changed in place meanwhile).
            leaves.append(mark_owned_batch(first.detach().unsqueeze(0)))
            continue
        if isinstance(first, (torch.Tensor, np.ndarray)):
            leaves.append(mark_owned_batch(torch.stack([torch.as_tensor(v) for v in column])))
            continue
        _check_stackable(first)
        if all(v == first for v in column[1:]):
            leaves.append(first)
        else:
            raise ValueError(
                f"a non-tensor value differs between samples ({column!r}); it cannot be stacked into one batch"
            )
    if strings_batched and spec.is_leaf() and isinstance(leaves[0], list):
        return (leaves[0],)  # a sample that is a bare string: one argument, the batch's strings
    return pytree.tree_unflatten(leaves, spec)


def stack_samples(samples: list[Any]) -> Any:
    """The default collate of ``ait.DataLoaderFactory``: ``_stack``."""
    return _stack(list(samples))


def _as_call(batch: Any) -> tuple[tuple, dict[str, Any]]:
    batch = _plain(batch)
    if isinstance(batch, Mapping):
        return (), dict(batch)
    if isinstance(batch, (tuple, list)):
        if len(batch) == 2 and isinstance(batch[0], (tuple, list)) and isinstance(batch[1], Mapping):
            return tuple(batch[0]), dict(batch[1])
        return tuple(batch), {}
    return (batch,), {}


def _leading_dim(batch: Any) -> int:
    for leaf in pytree.tree_leaves(_plain(batch)):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return leaf.shape[0]
    return 0


def _stack_key(sample: Any) -> tuple:
    """Samples with equal keys can be stacked: same structure, tensor shapes and dtypes,
    and non-tensor values."""
    leaves, spec = pytree.tree_flatten(_plain(sample))
    strings_batched = not _holds_tensor(leaves)  # prompts of any text batch together (_stack)
    return (spec, tuple((tuple(l.shape), l.dtype) if isinstance(l, (torch.Tensor, np.ndarray))
                        else "str" if strings_batched and isinstance(l, str) else repr(l) for l in leaves))


def _sample_batches(samples: Sequence[Any], batch_size: int) -> Iterator[Any]:
    """Batches of ``batch_size`` samples of equal shape. Samples are grouped by shape
    first (order kept), so a dataset may mix shapes (e.g. two image sizes); within a
    group an incomplete last batch is dropped, and a group smaller than
    ``batch_size`` is repeated to fill one batch."""
    groups: dict[tuple, list[Any]] = {}
    for index in range(len(samples)):
        sample = samples[index]
        groups.setdefault(_stack_key(sample), []).append(sample)
    for group in groups.values():
        if len(group) < batch_size:
            yield _stack([group[i % len(group)] for i in range(batch_size)])
            continue
        for start in range(0, len(group) - batch_size + 1, batch_size):
            yield _stack(group[start : start + batch_size])


class _Cycled(Dataset):
    """At least ``size`` samples, repeating a smaller dataset."""

    def __init__(self, dataset: Dataset, size: int):
        self.dataset, self.size = dataset, max(size, len(dataset))

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index % len(self.dataset)]


def _loader_batches(loader: DataLoader, batch_size: int) -> Iterator[tuple[int, Any]]:
    if loader.batch_size is None or not hasattr(loader.dataset, "__len__"):  # batches made by the user
        for batch in loader:
            yield _leading_dim(batch), batch
        return
    rebatched = DataLoader(
        _Cycled(loader.dataset, batch_size),
        batch_size=batch_size,
        collate_fn=loader.collate_fn,
        num_workers=loader.num_workers,
        drop_last=True,
    )
    for batch in rebatched:
        yield batch_size, batch


def stacks_samples(dataset: Any) -> bool:
    """Whether ``iterate_calls`` stacks ``dataset``'s samples into batches itself (a list of
    samples, a Dataset), rather than passing on batches the user made (a DataLoader, an
    ait.DataLoaderFactory, a factory callable ``batch_size -> batches``)."""
    return not (hasattr(dataset, "create_dataloader") or isinstance(dataset, DataLoader)
                or (callable(dataset) and not isinstance(dataset, (Sequence, Dataset, torch.Tensor))))


def iterate_calls(
    dataset: Any, batch_sizes: Sequence[int], max_num_batches_per_batch_size: int | None = None
) -> Iterator[tuple[int, tuple, dict[str, Any]]]:
    """Yields ``(batch_size, args, kwargs)`` for every batch of every batch size."""
    if isinstance(dataset, torch.Tensor):
        dataset = [dataset]
    if hasattr(dataset, "create_dataloader"):  # an ait.DataLoaderFactory (or AITune-style subclass)
        make: Callable[[int], Iterable[tuple[int, Any]]] = lambda b: (  # noqa: E731
            (b, batch) for batch in dataset.create_dataloader(b))
    elif isinstance(dataset, DataLoader):
        make = lambda b: _loader_batches(dataset, b)  # noqa: E731
        batch_sizes = batch_sizes if dataset.batch_size is not None else [0]
    elif callable(dataset) and not isinstance(dataset, (Sequence, Dataset)):
        make = lambda b: ((b, batch) for batch in dataset(b))  # noqa: E731
    else:
        if not isinstance(dataset, Sequence) and not (isinstance(dataset, Dataset) and hasattr(dataset, "__len__")):
            dataset = list(dataset)  # iterated once per batch size
        if len(dataset) == 0:
            raise ValueError("the dataset has no samples")
        make = lambda b: ((b, batch) for batch in _sample_batches(dataset, b))  # noqa: E731
    for batch_size in batch_sizes:
        for size, batch in itertools.islice(make(batch_size), max_num_batches_per_batch_size):
            args, kwargs = _as_call(batch)
            yield size, args, kwargs
