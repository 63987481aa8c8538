"""Materialised per-example gradients through Opacus (``hooks``, ``functorch``).

* ``hooks``: ``GradSampleModule`` with Opacus's per-layer samplers (functorch for the rest);
* ``functorch``: ``GradSampleModule(force_functorch=True)`` (vmap over every layer).

The engine offers the per-example gradients themselves (``per_example``: methods that read
them, gradient diagnostics, the audit's canaries) and the protocol's ``clipped_sum``, which
forms them at each evaluation point and combines, clips and sums them (``clip_materialised``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from opacus import GradSampleModule
from torch import nn

from dpbench.errors import ConfigError
from dpbench.training.engine.opacus_wrapped import OpacusWrapped
from dpbench.training.engine.per_user import clip_per_user
from dpbench.training.engine.protocol import (
    ClippedSum,
    FactorsFn,
    LossFn,
    Observer,
    Point,
    combined_gradients,
    flat_norms,
    kept_examples,
    register_engine,
    zero_rows,
)

# Opacus registers full backward hooks; with inputs that need no grad (data) torch warns each
# backward although the per-example gradients are exact (tests compare them one by one).
warnings.filterwarnings("ignore", message="Full backward hook is firing")
PerExampleFn = Callable[[LossFn, Any], tuple[list[torch.Tensor], torch.Tensor]]


class MaterialisedEngine(OpacusWrapped):
    """Wraps a model once in Opacus's ``GradSampleModule``; returns per-example gradients."""

    mode = "hooks"
    materialises = True
    combines_points_supported = True
    float32_handover = True
    per_user_supported = True
    #: vmap over every layer instead of Opacus's per-layer samplers
    force_functorch = False

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model, GradSampleModule(model, batch_first=True, loss_reduction="sum",
                                                 force_functorch=self.force_functorch))

    def per_example(self, loss_fn: LossFn, batch: Any) -> tuple[list[torch.Tensor],
                                                                 torch.Tensor]:
        """Return ([b, *p.shape] per parameter, losses [b]) for ``batch``."""
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

    def clipped_sum(self, loss_fn: LossFn, batch: Any, points: Sequence[Point],
                    factors_fn: FactorsFn, observe: Observer | None = None) -> ClippedSum:
        """The protocol's call, from the materialised gradients (``clip_materialised``)."""
        return clip_materialised(self.per_example, self.params, self.names, loss_fn, batch,
                                 points, factors_fn, observe)

    def clipped_user_sum(self, loss_fn: LossFn, batch: Any, users: torch.Tensor,
                         points: Sequence[Point], factors_fn: FactorsFn) -> ClippedSum:
        """Per-user clipping (``per_user.clip_per_user``): each user's gradient sum is
        formed from the materialised rows before its norm is clipped."""
        return clip_per_user(self.per_example, self.params, loss_fn, batch, users, points,
                             factors_fn)


@register_engine
class HooksEngine(MaterialisedEngine):
    """``hooks``: Opacus's per-layer grad samplers (functorch for layers it has none for)."""

    mode = "hooks"


@register_engine
class FunctorchEngine(MaterialisedEngine):
    """``functorch``: ``GradSampleModule(force_functorch=True)``, vmap over every layer."""

    mode = "functorch"
    force_functorch = True


def clip_materialised(per_example: PerExampleFn, params: Sequence[nn.Parameter],
                      names: Sequence[str], loss_fn: LossFn, batch: Any,
                      points: Sequence[Point], factors_fn: FactorsFn,
                      observe: Observer | None = None) -> ClippedSum:
    """Return ``ClippedSum`` from per-example gradients: Algorithm 1 of Abadi et al. (2016)
    on the combination ``u_i = sum_k w_k g_i(theta + delta_k)`` (docs/adding-a-method.md,
    stage 4), clipped by the method's factors and summed: ``sum_i f_i u_i``.

    ``per_example`` is an engine's (or a wrapper's, e.g. the audit's canaries) call.
    """
    combined, losses = combined_gradients(per_example, params, loss_fn, batch, points)
    norms = flat_norms(combined)
    kept = kept_examples(norms, losses).cpu()
    loss = losses[0]
    if not bool(kept.all()):  # a dropped example contributes 0 (its rows zeroed)
        combined = [zero_rows(c, kept) for c in combined]
        norms = torch.where(kept.to(norms.device), norms, torch.zeros_like(norms))
        loss = loss[kept[:len(loss)].to(loss.device)]
    if observe is not None and bool(kept.any()):  # diagnostics only (off by default)
        rows = kept.to(norms.device)
        observe({k: g[rows] for k, g in zip(names, combined)}, norms[rows])
    factors = factors_fn(norms)
    factors = torch.where(kept.to(factors.device), factors, torch.zeros_like(factors))
    sums = [torch.einsum("i,i...->...", factors.to(c.dtype), c) for c in combined]
    return ClippedSum(sums, norms, factors, loss, kept)
