"""Tensor helpers shared by the tasks, the methods and the loop."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn


def map_tensors(fn: Callable[[torch.Tensor], Any], batch: Any) -> Any:
    """Return ``batch`` (tensors nested in tuples, lists and dicts) with ``fn`` applied to
    every tensor; anything else is kept as it is."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: map_tensors(fn, v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_tensors(fn, v) for v in batch)
    return batch


def tensors_in(batch: Any) -> list[torch.Tensor]:
    """Return the tensors of ``batch``, in ``map_tensors``'s order."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        return [t for v in batch.values() for t in tensors_in(v)]
    if isinstance(batch, (list, tuple)):
        return [t for v in batch for t in tensors_in(v)]
    return []


def move_to(batch: Any, device: torch.device) -> Any:
    """Return ``batch`` with every tensor moved to ``device``."""
    return map_tensors(lambda t: t.to(device, non_blocking=True), batch)


@contextlib.contextmanager
def parameters_at(params: Sequence[nn.Parameter],
                  offsets: Sequence[torch.Tensor] | None) -> Iterator[None]:
    """Temporarily move the parameters to theta + offsets; restore theta exactly after."""
    if offsets is None:
        yield
        return
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, d in zip(params, offsets):
            p.add_(d)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)
