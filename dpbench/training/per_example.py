"""Per-example gradients through Opacus, in the grad-sample mode the config names.

* ``hooks``: ``GradSampleModule`` with Opacus's per-layer samplers (functorch for the rest);
* ``functorch``: ``GradSampleModule(force_functorch=True)`` (vmap over every layer);
* ``ghost``: ``GradSampleModuleFastGradientClipping`` (Li et al. 2022 ghost clipping): the
  first backward yields per-example norms only, the second backward of the re-weighted loss
  sum_i w_i l_i yields sum_i w_i g_i directly. It fits methods that evaluate one point and
  clip by norms alone.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import torch
from opacus import GradSampleModule
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from torch import nn

from dpbench.errors import ConfigError
from dpbench.utils.conf import GRAD_SAMPLE_MODES

# Opacus registers full backward hooks; with inputs that need no grad (data) torch warns each
# backward although the per-example gradients are exact (tests compare them one by one).
warnings.filterwarnings("ignore", message="Full backward hook is firing")
LossFn = Callable[[nn.Module, object], torch.Tensor]


class PerExampleGradients:
    """Wraps a model once; returns per-example gradients (or norms, in ghost mode)."""

    def __init__(self, model: nn.Module, mode: str = "hooks") -> None:
        if mode not in GRAD_SAMPLE_MODES:
            raise ConfigError(f"trainer.grad_sample_mode must be one of {GRAD_SAMPLE_MODES} "
                              f"(got {mode!r})")
        self.mode = mode
        if mode == "ghost":
            self.module: nn.Module = GradSampleModuleFastGradientClipping(
                model, batch_first=True, loss_reduction="sum", max_grad_norm=1.0,
                use_ghost_clipping=True)
        else:
            self.module = GradSampleModule(model, batch_first=True, loss_reduction="sum",
                                           force_functorch=mode == "functorch")
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]

    def _clear(self) -> None:
        for p in self.params:
            p.grad = None
            p.grad_sample = None
            if hasattr(p, "_norm_sample"):
                p._norm_sample = None

    def per_example(self, loss_fn: LossFn, batch) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Return ([b, *p.shape] per parameter, losses [b]) for ``batch``."""
        if self.mode == "ghost":
            raise ConfigError("ghost clipping computes norms only; this method needs "
                              "per-example gradients: use trainer.grad_sample_mode=hooks")
        self._clear()
        losses = loss_fn(self.module, batch)
        losses.sum().backward()
        grads = [p.grad_sample.detach() for p in self.params]
        self._clear()
        return grads, losses.detach()

    def ghost_clipped_sum(
        self, loss_fn: LossFn, batch, factors_fn: Callable[[torch.Tensor], torch.Tensor]
    ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return (sum_i w_i g_i per parameter, norms, factors, losses); g_i never built."""
        self._clear()
        losses = loss_fn(self.module, batch)
        losses.sum().backward(retain_graph=True)
        norms = self.module.get_norm_sample().detach()
        factors = factors_fn(norms).detach()
        for p in self.params:
            p.grad = None
        self.module.disable_hooks()
        try:
            (factors.to(losses.device) * losses).sum().backward()
        finally:
            self.module.enable_hooks()
        sums = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                for p in self.params]
        self._clear()
        return sums, norms, factors, losses.detach()


def flat_norms(per_example: Sequence[torch.Tensor]) -> torch.Tensor:
    """Return ||g_i||_2 over all parameters for each example."""
    norms = [torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1) for g in per_example]
    return torch.linalg.vector_norm(torch.stack(norms, dim=0), dim=0)

