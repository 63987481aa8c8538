"""The task interface: the loop never knows which task it runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn


class Task:
    """Loss per example and evaluation; subclasses are registered under a task kind."""

    name = ""
    #: opt in to ``observe_per_example_gradients`` (off by default: a pass over every g_i)
    observes_gradients: bool = False
    #: the loop's stream for per-example draws in the loss (None: torch's global RNG)
    generator: torch.Generator | None = None
    #: the observer reads only per-example norms of each layer's gradient: book-keeping may
    #: then pass one coordinate per layer holding that norm instead of the gradient itself
    observes_norms_only: bool = False

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

    def observe_per_example_gradients(self, named_grads: Mapping[str, torch.Tensor],
                                      norms: torch.Tensor, clip_norm: float) -> None:
        """See each chunk's unclipped per-example gradients by parameter name (diagnostics).

        Called by the loop only when ``observes_gradients`` and per-example gradients are
        materialised (not in ghost mode). What a task derives from them is computed on private
        data and is not privatised: log it as a diagnostic, never feed it back into training.
        """

    def step_metrics(self) -> dict[str, float]:
        """Return per-step diagnostics to log (e.g. from observed gradients)."""
        return {}

    def diagnostics_summary(self) -> dict[str, Any]:
        """Return training diagnostics gathered since the last call (e.g. gradient norms); reset.

        They are computed on private data and are *not* privatised: the loop stores them under
        results.json's ``unprivatised_diagnostics``, never in the headline ``metrics``.
        """
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Return task state a resumed run needs (e.g. accumulated diagnostics)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def primary_metric(self) -> tuple[str, str]:
        """Return (metric name, "max" or "min") that tables and reports lead with."""
        return "accuracy", "max"
