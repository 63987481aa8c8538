"""Tensor helpers shared by the tasks, the methods and the loop."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn


def move_to(batch: Any, device: torch.device) -> Any:
    """Return ``batch`` with every tensor moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: move_to(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to(v, device) for v in batch)
    return batch


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
