"""Opacus's ghost clipping (``ghost``): clipped sums of one evaluation point by two backwards.

Li, Tramer, Liang and Hashimoto (ICLR 2022): ``GradSampleModuleFastGradientClipping``'s first
backward yields the per-example norms only (the ghost norm); the second backward, of the
re-weighted loss ``sum_i f_i l_i``, yields ``sum_i f_i g_i`` directly. It fits methods that
evaluate one point and clip by norms alone; it offers no per-example gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from torch import nn

from dpbench.errors import ConfigError, PrivacyError
from dpbench.training.batches import batch_size, select_rows
from dpbench.training.engine.opacus_wrapped import OpacusWrapped
from dpbench.training.engine.protocol import (
    ClippedSum,
    FactorsFn,
    LossFn,
    Observer,
    Point,
    kept_examples,
    per_example_refused,
    register_engine,
)
from dpbench.utils.tensors import parameters_at


@register_engine
class GhostClippingEngine(OpacusWrapped):
    """Wraps a model once in Opacus's ghost-clipping module; returns clipped sums."""

    mode = "ghost"
    materialises = False
    #: one evaluation point per step only (the norm of a combination needs cross terms)
    combines_points_supported = False
    per_user_supported = False  # per-example norms only (engine/per_user.py)
    #: hands its per-example quantities over in the module's dtype, not float32
    float32_handover = False

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model, GradSampleModuleFastGradientClipping(
            model, batch_first=True, loss_reduction="sum", max_grad_norm=1.0,
            use_ghost_clipping=True))

    def per_example(self, loss_fn: LossFn, batch: Any) -> tuple[list[torch.Tensor],
                                                                 torch.Tensor]:
        raise per_example_refused(self.mode)

    def clipped_sum(self, loss_fn: LossFn, batch: Any, points: Sequence[Point],
                    factors_fn: FactorsFn, observe: Observer | None = None) -> ClippedSum:
        """The protocol's call for one point: ``sum_i w f_i g_i`` with ``f_i`` from
        ``||w g_i||``, no g_i built.

        A dropped example (``kept_examples``) is left out of both passes, which run again on
        the kept examples only: the re-weighted backward would compute 0 * NaN and poison
        every example's sum. ``observe`` is not served (ghost forms no per-example rows).
        """
        if len(points) != 1:
            raise PrivacyError("ghost clipping supports one evaluation point per step")
        weight = points[0].weight
        scale = abs(weight)
        with parameters_at(self.params, points[0].offsets):
            sums, norms, factors, losses, kept = self._clipped_sum(
                loss_fn, batch, lambda nr: factors_fn(scale * nr) if scale != 1.0
                else factors_fn(nr))
        if weight != 1.0:
            sums, norms = [weight * s for s in sums], scale * norms
        return ClippedSum(sums, norms, factors, losses, kept)

    def _clipped_sum(self, loss_fn: LossFn, batch: Any,
                     factors_fn: FactorsFn) -> ClippedSum:
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
            finite = kept_examples(part_norms, [losses]).cpu()
            if bool(finite.all()):
                part_factors = factors_fn(part_norms).detach()
                sums = self._reweighted_sum(losses, part_factors)
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
        return ClippedSum(sums, norms, factors, losses, kept)

    def _reweighted_sum(self, losses: torch.Tensor,
                        factors: torch.Tensor) -> list[torch.Tensor]:
        """Return the gradient of sum_i f_i l_i per parameter by a plain backward (hooks off)."""
        for p in self.params:
            p.grad = None
        self.module.disable_hooks()
        try:
            (factors.to(losses.device) * losses).sum().backward()
        finally:
            self.module.enable_hooks()
        return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                for p in self.params]
