"""Batch helpers that work on tensors nested in tuples, lists and dicts."""

from __future__ import annotations

from typing import Any

import torch

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
