"""The task interface: the loop never knows which task it runs."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class Task:
    """Loss per example and evaluation; subclasses are registered under a task kind."""

    name = ""

    def __init__(self, data: Any = None, **settings: Any) -> None:
        self.data = data
        self.settings = settings

    def per_example_loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """Return a vector with one loss per example of ``batch``."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module, loader: Any, device: torch.device,
                 predict: Any = None) -> dict[str, Any]:
        """Return test metrics (a flat dict of floats, plus lists for per-class values)."""
        raise NotImplementedError

    def primary_metric(self) -> tuple[str, str]:
        """Return (metric name, "max" or "min") that tables and reports lead with."""
        return "accuracy", "max"
