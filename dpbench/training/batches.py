"""Batch helpers that work on tensors nested in tuples, lists and dicts."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.utils.data import DataLoader, Subset, TensorDataset

from dpbench.utils.tensors import map_tensors


def batch_size(batch: Any) -> int:
    """Return the number of examples (first dimension of the first tensor)."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, dict):
        return batch_size(next(iter(batch.values())))
    return batch_size(batch[0])


def slice_batch(batch: Any, start: int, stop: int) -> Any:
    """Return examples [start, stop) of ``batch``."""
    return map_tensors(lambda t: t[start:stop], batch)


def physical_chunks(batch: Any, max_size: int | None):
    """Yield the logical batch in pieces of at most ``max_size`` (virtual batching); a batch
    that fits in one piece is yielded as it is (no slicing per step)."""
    n = batch_size(batch)
    if not max_size or n <= max_size:
        if n > 0:
            yield batch
        return
    step = n if not max_size else max_size
    for start in range(0, n, max(step, 1)):
        yield slice_batch(batch, start, min(start + step, n))


def select_rows(batch: Any, index: torch.Tensor) -> Any:
    """Return the examples of ``batch`` at ``index`` (a 1-D index tensor), in that order."""
    return map_tensors(lambda t: t[index.to(t.device)], batch)


def tensor_rows(dataset: Any) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None] | None:
    """Return (the tensors, the rows of them) of a ``TensorDataset`` seen through ``Subset``s
    (rows None: all of them, in order); None for any other data set. Example i of the
    outermost subset is row ``rows[i]`` of the tensors."""
    rows = None
    while isinstance(dataset, Subset):
        inner = torch.as_tensor(dataset.indices, dtype=torch.long)
        rows = inner if rows is None else inner[rows]
        dataset = dataset.dataset
    return (dataset.tensors, rows) if isinstance(dataset, TensorDataset) else None


class SlicedBatches:
    """The batches ``DataLoader(dataset, batch_size)`` yields in order, for a
    ``TensorDataset`` (or ``Subset``s of one), taken as slices of its tensors instead of
    fetched example by example and stacked by ``default_collate``: the same values, dtypes
    and shapes (a list of contiguous tensors per batch). Re-iterable, as a loader is."""

    def __init__(self, tensors: tuple[torch.Tensor, ...], rows: torch.Tensor | None,
                 size: int) -> None:
        self.tensors, self.rows, self.size = tensors, rows, size
        self.count = len(rows) if rows is not None else len(tensors[0])

    def __len__(self) -> int:
        return -(-self.count // self.size)

    def __iter__(self):
        for start in range(0, self.count, self.size):
            stop = min(start + self.size, self.count)
            if self.rows is None:
                yield [t[start:stop].contiguous() for t in self.tensors]
            else:
                chosen = self.rows[start:stop]
                yield [t[chosen] for t in self.tensors]


def evaluation_batches(dataset: Any, size: int) -> Iterable[Any]:
    """Return the in-order batches of ``size`` an evaluation reads: ``SlicedBatches`` where
    the data set is a ``TensorDataset`` (or ``Subset``s of one), else its ``DataLoader``."""
    found = tensor_rows(dataset)
    if found is None or not found[0]:
        return DataLoader(dataset, batch_size=size)
    return SlicedBatches(*found, size)
