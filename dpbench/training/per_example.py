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
from dpbench.training.batches import batch_size, select_rows

OPACUS_MODES = ("hooks", "functorch", "ghost")  # bk and auto: engines.py
# Opacus registers full backward hooks; with inputs that need no grad (data) torch warns each
# backward although the per-example gradients are exact (tests compare them one by one).
warnings.filterwarnings("ignore", message="Full backward hook is firing")
LossFn = Callable[[nn.Module, object], torch.Tensor]


class PerExampleGradients:
    """Wraps a model once; returns per-example gradients (or norms, in ghost mode)."""

    def __init__(self, model: nn.Module, mode: str = "hooks") -> None:
        if mode not in OPACUS_MODES:
            raise ConfigError(f"trainer.grad_sample_mode must be one of {OPACUS_MODES} "
                              f"(got {mode!r})")
        self.mode = mode
        #: the run combines several evaluation points (the per-run check checks that path too)
        self.combines_points = False
        if mode == "ghost":
            self.module: nn.Module = GradSampleModuleFastGradientClipping(
                model, batch_first=True, loss_reduction="sum", max_grad_norm=1.0,
                use_ghost_clipping=True)
        else:
            self.module = GradSampleModule(model, batch_first=True, loss_reduction="sum",
                                           force_functorch=mode == "functorch")
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]

    def close(self) -> None:
        """Remove Opacus's hooks from the model (the loop falls back to another engine)."""
        self._clear()
        self.module._close()

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
        n = losses.shape[0]
        grads = []
        for name, p in zip(self.names, self.params):
            sample = p.grad_sample
            if sample is None:
                self._clear()
                raise ConfigError(f"grad_sample_mode={self.mode}: Opacus computed no "
                                  f"per-example gradient for parameter {name!r} (a weight "
                                  "computed in the forward or used outside its layer)")
            if sample.dim() == 0 or sample.shape[0] != n:
                self._clear()
                raise ConfigError(f"grad_sample_mode={self.mode}: parameter {name!r} has "
                                  f"per-example gradients of leading size {sample.shape[0]}, "
                                  f"not the {n} examples of the batch (a time-first layer "
                                  "or examples folded into another axis)")
            grads.append(sample.detach().to(p.dtype))  # bf16-mixed: float32 from here
        self._clear()
        return grads, losses.detach()

    def ghost_clipped_sum(
        self, loss_fn: LossFn, batch, factors_fn: Callable[[torch.Tensor], torch.Tensor]
    ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return (sum_i w_i g_i per parameter, norms, factors, kept losses, kept); no g_i built.

        An example whose loss or norm is non-finite is dropped (norm and factor 0, ``kept``
        False): the re-weighted backward would compute 0 * NaN and poison every example's
        sum, so both passes run again on the finite examples only.
        """
        n = batch_size(batch)
        index = torch.arange(n)
        while True:
            part = batch if len(index) == n else select_rows(batch, index)
            if len(index) == 0:
                sums, part_norms, part_factors, losses = [torch.zeros_like(p) for p in
                                                          self.params], None, None, None
                break
            self._clear()
            losses = loss_fn(self.module, part)
            losses.sum().backward(retain_graph=True)
            part_norms = self.module.get_norm_sample().detach()
            if part_norms.shape[:1] != losses.shape[:1]:
                self._clear()
                raise ConfigError(f"grad_sample_mode=ghost: {part_norms.shape[0]} "
                                  f"per-example norms for {losses.shape[0]} examples (a "
                                  "time-first layer or examples folded into another axis)")
            finite = (torch.isfinite(part_norms) & torch.isfinite(losses.detach())).cpu()
            if bool(finite.all()):
                sums, part_factors = self._reweighted_sum(losses, factors_fn(part_norms))
                break
            index = index[finite]
        self._clear()
        device, dtype = self.params[0].device, self.params[0].dtype  # the model's precision
        norms = torch.zeros(n, device=device, dtype=dtype)
        factors = torch.zeros(n, device=device, dtype=dtype)
        kept = torch.zeros(n, dtype=torch.bool)
        kept[index] = True
        if len(index):
            norms[index.to(device)] = part_norms.to(device, norms.dtype)
            factors[index.to(device)] = part_factors.to(device, factors.dtype)
            losses = losses.detach()
        else:
            losses = torch.zeros(0, device=device)
        return sums, norms, factors, losses, kept

    def _reweighted_sum(self, losses: torch.Tensor,
                        factors: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Return (grad of sum_i w_i l_i per parameter, w) by a plain backward (hooks off)."""
        factors = factors.detach()
        for p in self.params:
            p.grad = None
        self.module.disable_hooks()
        try:
            (factors.to(losses.device) * losses).sum().backward()
        finally:
            self.module.enable_hooks()
        sums = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                for p in self.params]
        return sums, factors


def flat_norms(per_example: Sequence[torch.Tensor]) -> torch.Tensor:
    """Return ||g_i||_2 over all parameters for each example."""
    norms = [torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1) for g in per_example]
    return torch.linalg.vector_norm(torch.stack(norms, dim=0), dim=0)

