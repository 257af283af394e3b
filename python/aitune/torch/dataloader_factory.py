"""ait.DataLoaderFactory: a dataset with its own collate function, batched by ait.tune /
ait.inspect at each batch size (AITune's ``aitune.torch.DataLoaderFactory``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader, Dataset

from aitune.torch.dataset import stack_samples


class _Repeated(Dataset):
    """At least ``size`` samples, repeating a smaller dataset (a batch is always full)."""

    def __init__(self, dataset: Any, size: int):
        self.dataset, self.size = dataset, max(size, len(dataset))

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index % len(self.dataset)]


class DataLoaderFactory:
    """Makes a ``torch.utils.data.DataLoader`` over ``dataset`` for each batch size asked.

    Args:
        dataset: a sequence or map-style Dataset of samples.
        collate_fn: makes one batch from a list of samples (for samples the default
            cannot stack: dicts holding lists of tensors, strings to tokenize, padding).
            Default: samples stacked on a new axis 0, non-tensor values kept (they must be
            equal), as ``ait.tune`` does with plain samples.
        num_workers: the DataLoader's worker processes.

    A batch is a tensor or tuple/list (positional arguments), a dict (keyword
    arguments), or ``(args, kwargs)``. Only full batches are made; a dataset smaller than
    the batch size is repeated to fill one.
    """

    def __init__(self, dataset: Any, collate_fn: Callable[[list], Any] | None = None, num_workers: int = 0):
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise TypeError(f"dataset must be a sequence or map-style Dataset, got {type(dataset).__name__}")
        if len(dataset) == 0:
            raise ValueError("the dataset has no samples")
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"collate_fn must be callable, got {type(collate_fn).__name__}")
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.num_workers = num_workers

    def create_dataloader(self, batch_size: int) -> DataLoader:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        dataset = self.dataset if len(self.dataset) >= batch_size else _Repeated(self.dataset, batch_size)
        return DataLoader(dataset, batch_size=batch_size, collate_fn=self.collate_fn or stack_samples,
                          drop_last=True, num_workers=self.num_workers)

    def __repr__(self) -> str:
        collate = getattr(self.collate_fn, "__qualname__", repr(self.collate_fn)) if self.collate_fn else "default"
        return f"DataLoaderFactory({type(self.dataset).__name__} of {len(self.dataset)}, collate_fn={collate})"
