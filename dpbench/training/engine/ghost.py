"""Opacus's ghost clipping (``ghost``): clipped sums of one evaluation point by two backwards.

Li, Tramer, Liang and Hashimoto (ICLR 2022): ``GradSampleModuleFastGradientClipping``'s first
backward yields the per-example norms only (the ghost norm); the second backward, of the
re-weighted loss ``sum_i f_i l_i``, yields ``sum_i f_i g_i`` directly. It fits methods that
evaluate one point and clip by norms alone; it offers no per-example gradients.

Per user (``privacy.unit=user``, user-level sampling: ``clipped_user_sum``) the first
backward yields each user's norm ``||D_u||``, ``D_u = sum_{i in u} g_i``
(``UserGhostClipping``): for the layers Opacus clips by the ghost norm (``Linear``,
``Embedding``: Goodfellow 2015; Li et al. 2022, sec. 4) the user is one example whose tokens are
its examples' tokens concatenated (``user_rows``), so Opacus's own norm sampler gives
``||D_u||`` cross terms included; for the others Opacus's per-example gradients are summed per
user before their norm. The second backward, of ``sum_i c_{u(i)} l_i``, yields
``sum_u c_u D_u``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from opacus.grad_sample.functorch import ft_compute_per_sample_gradient
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
from dpbench.training.engine.user_rows import UserRows
from dpbench.utils.tensors import parameters_at

#: the layers whose per-example gradient is a sum over tokens and whose norm Opacus forms by
#: the ghost norm: per user, their tokens are regrouped (``UserRows.tokens``)
TOKEN_SUM_LAYERS = (nn.Linear, nn.Embedding)


class UserGhostClipping(GradSampleModuleFastGradientClipping):
    """Opacus's ghost-clipping module whose first backward can form per-USER norms.

    With ``user_rows`` set, each layer's backward hook stores ``||D_u^l||`` [U] in the
    parameters' ``_norm_sample`` instead of per-example norms (the module doc of ``ghost``);
    with it None (the default) the hook is Opacus's own.
    """

    user_rows: UserRows | None = None

    def capture_backprops_hook(self, module: nn.Module, _forward_input: torch.Tensor,
                               forward_output: torch.Tensor, loss_reduction: str,
                               batch_first: bool) -> None:
        rows = self.user_rows
        if rows is None or not self.hooks_enabled:
            return super().capture_backprops_hook(module, _forward_input, forward_output,
                                                  loss_reduction, batch_first)
        params = [p for p in module.parameters() if p.requires_grad]
        if any(p._forward_counter != 1 for p in params):
            raise ConfigError(f"trainer.grad_sample_mode=ghost: layer {type(module).__name__} "
                              "is called more than once in one forward, which the per-user "
                              "norm does not cover; use trainer.grad_sample_mode=hooks")
        activations, backprops = self.rearrange_grad_samples(
            module=module, backprops=forward_output[0].detach(),
            loss_reduction=loss_reduction, batch_first=batch_first)
        if self.use_ghost_clipping and isinstance(module, TOKEN_SUM_LAYERS) \
                and type(module) in self.NORM_SAMPLERS:
            grouped = [rows.tokens(a) if a.is_floating_point() else rows.ids_tokens(a)
                       for a in activations]
            norms = self.NORM_SAMPLERS[type(module)](module, grouped, rows.tokens(backprops))
        else:
            sampler = (self.GRAD_SAMPLERS[type(module)] if not self.force_functorch
                       and type(module) in self.GRAD_SAMPLERS
                       else ft_compute_per_sample_gradient)
            norms = {p: torch.linalg.vector_norm(rows.sums(gs).reshape(rows.count, -1), dim=1)
                     for p, gs in sampler(module, activations, backprops).items()}
        for p in params:
            p._norm_sample = norms[p]
            p._forward_counter -= 1
        if len(module.activations) == 0 and hasattr(module, "max_batch_len"):
            del module.max_batch_len


@register_engine
class GhostClippingEngine(OpacusWrapped):
    """Wraps a model once in Opacus's ghost-clipping module; returns clipped sums."""

    mode = "ghost"
    materialises = False
    #: one evaluation point per step only (the norm of a combination needs cross terms)
    combines_points_supported = False
    #: per-user norms in the first backward (``UserGhostClipping``)
    per_user_supported = True
    #: hands its per-example quantities over in the module's dtype, not float32
    float32_handover = False

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model, UserGhostClipping(
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

    def clipped_user_sum(self, loss_fn: LossFn, batch: Any, users: torch.Tensor,
                         points: Sequence[Point], factors_fn: FactorsFn) -> ClippedSum:
        """Per-user clipping (``per_user``): ``sum_u w c_u D_u`` with ``c_u`` from
        ``||w D_u||`` by two backwards (the module doc), one evaluation point.

        The drop rule is the per-example one (``protocol.kept_examples``): rows whose loss is
        not finite are left out and both passes run on the rest; if a user's norm is not
        finite, one per-example norm pass finds the examples whose own gradient is not, which
        are left out too (a user whose sum alone overflows is left out whole). A user with no
        kept example has norm and factor 0. The rows of a user need not be contiguous.
        """
        if len(points) != 1:
            raise PrivacyError("ghost clipping supports one evaluation point per step")
        weight = points[0].weight
        scale = abs(weight)
        everyone = UserRows.of(users)
        index = torch.arange(len(everyone.inverse))
        with parameters_at(self.params, points[0].offsets):
            try:
                sums, index, rows, norms_u, factors_u, losses = self._user_passes(
                    loss_fn, batch, users, index, scale, factors_fn)
            finally:
                self.module.user_rows = None
                self._clear()
        device, dtype = self.params[0].device, self.params[0].dtype
        norms = torch.zeros(everyone.count, device=device, dtype=dtype)
        factors = torch.zeros(everyone.count, device=device, dtype=dtype)
        kept = torch.zeros(everyone.count, dtype=torch.bool)
        if rows is not None:
            at = torch.searchsorted(everyone.ids, rows.ids)
            kept[at] = True
            norms[at.to(device)] = (scale * norms_u).to(device, dtype)
            factors[at.to(device)] = factors_u.to(device, dtype)
        if weight != 1.0:
            sums = [weight * s for s in sums]
        return ClippedSum(sums, norms, factors, losses, kept)

    def _user_passes(self, loss_fn: LossFn, batch: Any, users: torch.Tensor,
                     index: torch.Tensor, scale: float, factors_fn: FactorsFn):
        """Return (sums, the rows kept, their ``UserRows``, ||D_u||, c_u, the kept losses)."""
        n = len(index)
        while len(index):
            part = batch if len(index) == n else select_rows(batch, index)
            rows = UserRows.of(users.cpu()[index], self.params[0].device)
            self._clear()
            self.module.user_rows = None
            losses = loss_fn(self.module, part)
            self.module.user_rows = rows
            losses.sum().backward(retain_graph=True)  # also releases the hooks' activations
            self.module.user_rows = None
            finite = torch.isfinite(losses.detach()).cpu()
            if not bool(finite.all()):  # the row is left out of both passes
                index = index[finite]
                continue
            norms_u = self.module.get_norm_sample().detach()
            if norms_u.shape[:1] != (rows.count,):
                raise ConfigError(f"grad_sample_mode=ghost: {norms_u.shape[0]} per-user "
                                  f"norms for {rows.count} users (a time-first layer or "
                                  "examples folded into another axis)")
            finite_u = torch.isfinite(norms_u).cpu()
            if bool(finite_u.all()):
                factors_u = factors_fn(scale * norms_u).detach()
                sums = self._reweighted_sum(losses, rows.per_row(factors_u))
                return sums, index, rows, norms_u, factors_u, losses.detach()
            self._clear()  # find the examples whose own gradient is not finite
            losses = loss_fn(self.module, part)
            losses.sum().backward()
            example = torch.isfinite(self.module.get_norm_sample().detach()).cpu()
            index = index[example] if not bool(example.all()) else \
                index[finite_u[rows.inverse]]
        device = self.params[0].device
        return ([torch.zeros_like(p) for p in self.params], index, None, None, None,
                torch.zeros(0, device=device))
