"""Book-keeping clipping (``trainer.grad_sample_mode=bk``): clipped sums in one backward.

Bu, Wang, Zha and Karypis, "Differentially private optimization on large model at small
cost" (ICML 2023). One forward pass records each trainable layer's input ``a``; one backward
(``torch.autograd.grad`` of the summed loss with respect to the layers' *outputs*, so no
parameter gradient is formed) yields the output gradients ``g``. Then, per layer
(``rules``):

1. per-example squared norms by the ghost norm or by instantiation, whichever is cheaper;
   ``||g_i||^2 = sum_layers ||G_i^l||^2``;
2. the method's clip factors ``f_i = factors_fn(||g_i||)``;
3. ``sum_i f_i G_i^l`` from the book-kept ``a`` and the re-weighted ``f_i g_i`` (one matmul /
   weight-gradient call per layer).

Neither a second backward (ghost clipping) nor a B x params tensor (Opacus hooks) is made.
The engine answers the protocol's ``clipped_sum`` (``protocol``) and materialises nothing:
methods that need only norms and factors run on it. For methods that combine per-example
gradients of several evaluation points before clipping (DiSK, FIBER, IVON with several
samples) it runs one forward and backward per point, and the per-layer rules form the norm of
the combination, cross terms included, from the recorded activations and output gradients
(``rules``).

Per user (``privacy.unit=user``, user-level sampling: ``clipped_user_sum``) the same backward
serves: each rule forms ``||D_u||^2`` with the user as one example whose positions are its
examples' positions concatenated (``user_rows``), and the clipped sum re-weights every row of
user u by ``c_u``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from dpbench.errors import ConfigError
from dpbench.training.engine.protocol import (
    ClippedSum,
    FactorsFn,
    LossFn,
    Observer,
    Point,
    kept_examples,
    per_example_refused,
    register_engine,
    trainable,
    zero_rows,
)
from dpbench.training.engine.rules import Call, Calls, rule_for, unsupported_reason
from dpbench.training.engine.rules.base import added
from dpbench.training.engine.user_rows import UserRows
from dpbench.utils.tensors import parameters_at


def trainable_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Return (name, module) for every module that directly owns a trainable parameter."""
    return [(name, m) for name, m in model.named_modules()
            if any(p.requires_grad for p in m.parameters(recurse=False))]


def bk_unsupported(model: nn.Module) -> str | None:
    """Return a one-line reason book-keeping cannot run ``model`` exactly, or None."""
    owners: dict[int, str] = {}
    for name, m in trainable_layers(model):
        reason = unsupported_reason(m)
        if reason is not None:
            return f"layer {name or type(m).__name__!r}: {reason}"
        for p in m.parameters(recurse=False):
            if p.requires_grad and owners.setdefault(id(p), name) != name:
                return f"parameter shared by layers {owners[id(p)]!r} and {name!r}"
    return None


@register_engine
class BookKeepingEngine:
    """Hooks a model once; returns clipped sums, norms and factors from one backward per point."""

    mode = "bk"
    materialises = False
    combines_points_supported = True
    #: each user's norm from the rules with the user as one long example (``clipped_user_sum``)
    per_user_supported = True
    float32_handover = True

    def __init__(self, model: nn.Module) -> None:
        reason = bk_unsupported(model)
        if reason is not None:
            raise ConfigError(f"trainer.grad_sample_mode=bk cannot run this model ({reason}); "
                              "use trainer.grad_sample_mode=hooks or auto")
        self.module = model
        #: the run combines several evaluation points (the per-run check checks that path too)
        self.combines_points = False
        self.params, self.names = trainable(model)
        self._recording = False
        #: (layer, its input, its output, the output's version, state, the input's version)
        self._records: list[tuple[nn.Module, torch.Tensor, torch.Tensor, int, Any, int]] = []
        named = trainable_layers(model)
        layers = [m for _, m in named]
        self._layer_names = {m: name for name, m in named}
        self._layer_norm_sq: dict[nn.Module, torch.Tensor] = {}
        self._rules = {m: rule_for(m) for m in layers}
        self._states = {m: rule.state for m, rule in self._rules.items()}
        self._own = {m: [p for p in m.parameters(recurse=False) if p.requires_grad]
                     for m in layers}
        # first of the forward hooks: the layer's own output is recorded, before any hook of
        # the model's replaces it (the rules need the gradient with respect to that output).
        # Parameters that enter outside a layer (a ViT's pos_embed) are read at the input of
        # their rule's entry module, where they have been added.
        self._handles = []
        for m in layers:
            entry = self._rules[m].entry
            if entry is None:
                self._handles.append(m.register_forward_hook(self._record, prepend=True))
            else:
                self._handles.append(entry(m).register_forward_hook(
                    functools.partial(self._record_entry, m), prepend=True))

    def _record(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        if self._recording and torch.is_grad_enabled() and output.requires_grad:
            state = self._states[module]
            self._records.append((module, inputs[0].detach(), output, output._version,
                                  None if state is None else state(module),
                                  inputs[0]._version))

    def _record_entry(self, owner: nn.Module, module: nn.Module, inputs: tuple,
                      output: torch.Tensor) -> None:
        z = inputs[0]
        if self._recording and torch.is_grad_enabled() and z.requires_grad:
            self._records.append((owner, z.detach(), z, z._version, None, z._version))

    def _name(self, module: nn.Module) -> str:
        return repr(self._layer_names.get(module) or type(module).__name__)

    def per_example(self, loss_fn: LossFn, batch) -> tuple[list[torch.Tensor], torch.Tensor]:
        raise per_example_refused(self.mode)

    def _forward_backward(self, loss_fn: LossFn, batch, weight: float = 1.0):
        """Return (losses, whether all are finite, {module: [calls]}) after one forward and
        one backward. ``weight`` scales the output gradients (a point's weight).
        """
        self._records = []
        self._recording = True
        try:
            losses = loss_fn(self.module, batch)
        finally:
            self._recording = False
        records, self._records = self._records, []
        total = losses.sum()
        all_finite = math.isfinite(float(total.detach()))  # one check of the sum, one read
        if not all_finite:  # a dropped example's loss is masked before the backward
            total = torch.where(torch.isfinite(losses.detach()), losses,
                                torch.zeros_like(losses)).sum()
        if weight != 1.0:
            total = total * weight
        n = losses.shape[0] if losses.dim() else 0
        for module, a, out, version, _, a_version in records:
            if a._version != a_version:
                self._check_inputs(module, [Call(a, out, None, a_version)])
            if out._version != version:
                raise ConfigError(f"book-keeping: the output of layer {self._name(module)} is "
                                  "modified in place later in the forward (e.g. "
                                  "ReLU(inplace=True)); make it out-of-place or use "
                                  "trainer.grad_sample_mode=hooks")
            if a.dim() == 0 or a.shape[0] != n or out.dim() == 0 or out.shape[0] != n:
                # the rules read dim 0 as the example (eq. 2 sums over the other dims only)
                raise ConfigError(
                    f"book-keeping: layer {self._name(module)} sees a leading size of "
                    f"{a.shape[0] if a.dim() else 0}, not the {n} examples of the batch (a "
                    "time-first layer or examples folded into another axis); only models "
                    "that keep the example on dim 0 of every layer are supported")
        grads = (torch.autograd.grad(total, [r[2] for r in records], allow_unused=True)
                 if records and total.requires_grad else [None] * len(records))
        layers: dict[nn.Module, Calls] = {}
        for (module, a, _, _, state, a_version), g in zip(records, grads):
            if g is not None:  # bf16-mixed: norms and sums in the parameters' float32
                dtype = self._own[module][0].dtype
                layers.setdefault(module, []).append(
                    Call(_as_dtype(a, dtype), _as_dtype(g, dtype), state, a_version))
        for module, calls in layers.items():
            if len(calls) > 1 and not self._rules[module].concat_calls:
                raise ConfigError(f"book-keeping: layer {self._name(module)} is called "
                                  f"{len(calls)} times in one forward; use "
                                  "trainer.grad_sample_mode=hooks")
        return losses.detach(), all_finite, layers

    def clipped_sum(self, loss_fn: LossFn, batch: Any, points: Sequence[Point],
                    factors_fn: FactorsFn, observe: Observer | None = None) -> ClippedSum:
        """The protocol's call: ``sum_i f_i d_i`` for ``d_i = sum_k w_k g_i(theta + delta_k)``.

        One point (most methods): one forward and one backward. Several: DiSK's observation
        ``u_i = (1 - a) g_i(theta) + a g_i(theta + gamma d)`` (Zhang et al. 2024, their
        observation u_t, docs/fiber-disk-adambc.md; FIBER's alike) and IVON's average over
        posterior samples, with one forward and one backward per point, each with its output
        gradients scaled by w_k; each layer's calls at the points are then one call list,
        whose rule gives ``||d_i||^2`` with the cross terms ``2 w_k w_l <g_i(x_k), g_i(x_l)>``
        (the ghost inner products of ``rules``) and the clipped sum as one
        re-weighted weight gradient per point. No per-example gradient is materialised.

        A dropped example (``kept_examples``: a non-finite loss at any point, or norm) has
        its loss masked before the backward and its rows zeroed before the clipped sums
        (0 * inf would be NaN), so no second pass is needed; the losses returned are the kept
        ones of the first point. ``observe`` gets the kept examples' per-layer norms.
        """
        point_losses, all_finite, layers = self._points(loss_fn, batch, points)
        result = self._clip(point_losses, all_finite, layers, factors_fn)
        if observe is not None and bool(result.kept.any()):  # diagnostics only
            rows = result.kept.to(result.norms.device)
            observe({k: v[rows] for k, v in self.layer_norms().items()}, result.norms[rows])
        return result

    def _points(self, loss_fn: LossFn, batch: Any, points: Sequence[Point]
                ) -> tuple[list[torch.Tensor], bool, dict[nn.Module, Calls]]:
        """Return (each point's losses, whether all are finite, {module: calls}) after one
        forward and one backward per point (``clipped_sum``'s docstring)."""
        point_losses, all_finite, layers = [], True, {}
        for point in points:
            if point.offsets is None:  # theta itself (most methods): nothing to move
                point_loss, finite, point_layers = self._forward_backward(loss_fn, batch,
                                                                          point.weight)
            else:
                with parameters_at(self.params, point.offsets):
                    point_loss, finite, point_layers = self._forward_backward(
                        loss_fn, batch, point.weight)
            point_losses.append(point_loss)
            all_finite &= finite
            for module, calls in point_layers.items():
                layers.setdefault(module, []).extend(calls)
        if len(points) > 1:
            layers = {m: self._same_inputs_merged(m, calls) for m, calls in layers.items()}
        return point_losses, all_finite, layers

    def clipped_user_sum(self, loss_fn: LossFn, batch: Any, users: torch.Tensor,
                         points: Sequence[Point], factors_fn: FactorsFn) -> ClippedSum:
        """Per-user clipping (``per_user``): ``sum_u c_u D_u`` with ``c_u = factors_fn(||D_u||)``
        and ``D_u = sum_{i in u} d_i``, from the same one backward per point.

        Each layer's rule gives ``||D_u||^2`` from the recorded inputs and output gradients
        with the user as one example whose positions are its examples' positions concatenated
        (``LayerRule.user_norm_sq``, ``user_rows``: Bu et al. 2023, eq. 2 and 4 over the user's
        tokens; the ghost norm of Goodfellow 2015 and Li et al. 2022); the clipped sum is the
        layers' re-weighted weight gradients (their eq. 5) with every row of user u weighted
        by ``c_u``: ``sum_u c_u D_u = sum_i c_{u(i)} d_i``. No per-example or per-user gradient
        of a large layer is formed. The rows of a user need not be contiguous.

        The drop rule is the per-example one (``protocol.kept_examples``): an example whose
        loss at some point is not finite is masked before the backward; if a user's norm is
        not finite, the per-example norms find the examples whose own gradient is not, which
        are dropped, and a user still not finite is dropped whole. A dropped example adds
        nothing to its user's sum; a user with no kept example has norm and factor 0.
        """
        rows = UserRows.of(users, self.params[0].device if self.params else None)
        point_losses, _, layers = self._points(loss_fn, batch, points)
        for module in layers:
            self._check_user_rule(module)
        ok = kept_examples(torch.zeros(len(rows.inverse)), point_losses).cpu()
        if not bool(ok.all()):  # inputs of a dropped row may be inf: 0 * inf is NaN
            layers = _rows_zeroed(layers, ok)
        user_sq = self._user_norm_sq(layers, rows, point_losses[0])
        if not bool(torch.isfinite(user_sq).all()):  # find the examples that are not finite
            example_sq = added([self._rules[m].norm_sq(m, calls) for m, calls in
                                layers.items()]) if layers else torch.zeros(len(ok))
            ok &= torch.isfinite(example_sq).cpu()
            layers = _rows_zeroed(layers, ok)
            user_sq = self._user_norm_sq(layers, rows, point_losses[0])
        finite_u = torch.isfinite(user_sq).cpu()
        kept_u = torch.zeros(rows.count, dtype=torch.bool)
        kept_u[rows.inverse[ok]] = True
        kept_u &= finite_u
        if not bool(finite_u.all()):  # a user whose sum overflows is dropped whole
            ok &= kept_u[rows.inverse]
            layers = _rows_zeroed(layers, ok)
        keep_u = kept_u.to(user_sq.device)
        norms = torch.where(keep_u, user_sq, torch.zeros_like(user_sq)).sqrt()
        factors = torch.where(keep_u, factors_fn(norms).to(norms.dtype), torch.zeros_like(norms))
        f_rows = rows.per_row(factors)
        sums: dict[nn.Parameter, torch.Tensor] = {}
        for module, calls in layers.items():
            sums.update(self._rules[module].clipped(module, calls, f_rows))
        out = [sums[p] if p in sums else torch.zeros_like(p) for p in self.params]
        losses = point_losses[0]
        if not bool(ok.all()):
            losses = losses[ok[:len(losses)].to(losses.device)]
        return ClippedSum(out, norms, factors, losses, kept_u)

    def _user_norm_sq(self, layers: dict[nn.Module, Calls], rows: UserRows,
                      like: torch.Tensor) -> torch.Tensor:
        """Return per-user ||D_u||^2 [U] summed over the layers' rules."""
        if not layers:
            return torch.zeros(rows.count, dtype=like.dtype, device=like.device)
        return added([self._rules[m].user_norm_sq(m, calls, rows)
                      for m, calls in layers.items()])

    def _check_user_rule(self, module: nn.Module) -> None:
        """Refuse, in one line naming the layer, a rule without a per-user norm."""
        if not self._rules[module].per_user:
            raise ConfigError(per_user_layer_refusal(self.mode, self._name(module),
                                                      type(module).__name__))

    def _check_inputs(self, module: nn.Module, calls: Calls) -> None:
        """Refuse a layer whose recorded input was modified in place after the layer read it
        (later in the forward, or by a later evaluation point's): every rule reads it."""
        for c in calls:
            if c.a._version != c.version:
                raise ConfigError(f"book-keeping: the input of layer {self._name(module)} is "
                                  "modified in place after the layer read it; make it "
                                  "out-of-place or use trainer.grad_sample_mode=hooks")

    def _same_inputs_merged(self, module: nn.Module, calls: Calls) -> Calls:
        """Return the calls, those reading the very same input (the data, for a first layer)
        merged into one with their output gradients added.

        A rule's per-example gradient is linear in g for a fixed input (eq. 2), so
        ``G_i(a, g_1) + G_i(a, g_2) = G_i(a, g_1 + g_2)``: one call's work instead of two. Not
        for a rule with a point's state (the weight standardisation's Jacobian differs between
        points). An input modified in place after it was recorded (by a later point's
        forward) is refused: every rule reads it.
        """
        self._check_inputs(module, calls)
        if len(calls) == 1 or self._rules[module].state is not None:
            return calls
        merged: list[Call] = []
        for c in calls:
            for k, m in enumerate(merged):
                if _same_tensor(m.a, c.a):
                    merged[k] = Call(m.a, m.g + c.g, None, m.version)
                    break
            else:
                merged.append(c)
        return merged

    def _clip(self, point_losses: list[torch.Tensor], all_finite: bool,
              layers: dict[nn.Module, Calls], factors_fn: FactorsFn) -> ClippedSum:
        """Return the ``ClippedSum`` of the layers' calls (the points' losses decide which
        examples are kept, with the norms: ``kept_examples``)."""
        losses = point_losses[0]
        kept_grads: dict[nn.Parameter, torch.Tensor] = {}  # instantiated per-example grads
        self._layer_norm_sq = {m: self._rules[m].norm_sq(m, calls, kept_grads)
                               for m, calls in layers.items()}
        norm_sq = added(list(self._layer_norm_sq.values())) if layers else torch.zeros_like(losses)
        norms = norm_sq.sqrt()
        if all_finite and math.isfinite(float(norm_sq.sum())):  # the rule, on the sums
            factors = factors_fn(norms).to(norms.dtype)
            kept = torch.ones(len(norms), dtype=torch.bool)
        else:  # a dropped example contributes exactly 0 (its rows zeroed: 0 * inf is NaN)
            ok = kept_examples(norms, point_losses)
            norms = torch.where(ok, norms, torch.zeros_like(norms))
            factors = torch.where(ok, factors_fn(norms).to(norms.dtype), torch.zeros_like(norms))
            layers = {m: [Call(zero_rows(c.a, ok), zero_rows(c.g, ok), c.state)
                          for c in calls] for m, calls in layers.items()}
            self._layer_norm_sq = {m: torch.where(ok, v, torch.zeros_like(v))
                                   for m, v in self._layer_norm_sq.items()}
            kept_grads = {p: zero_rows(v, ok) for p, v in kept_grads.items()}
            kept = ok.cpu()
            losses = losses[ok]
        sums = {p: torch.einsum("b,b...->...", factors, v) for p, v in kept_grads.items()}
        for module, calls in layers.items():
            if not all(p in kept_grads for p in self._own[module]):
                sums.update(self._rules[module].clipped(module, calls, factors))
        zeros = torch.zeros_like
        out = [sums[p] if p in sums else zeros(p) for p in self.params]
        return ClippedSum(out, norms, factors, losses, kept)

    def layer_norms(self) -> dict[str, torch.Tensor]:
        """Return {layer name: [B, 1] per-example norm of its gradient} of the last call.

        For observers that need only per-layer norms (``Task.observes_norms_only``): one
        coordinate per layer whose square is that layer's ||g_i||^2 (diagnostics only).
        """
        return {self._layer_names[m]: sq.sqrt().unsqueeze(1)
                for m, sq in self._layer_norm_sq.items()}

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    close = remove_hooks


def _rows_zeroed(layers: dict[nn.Module, Calls], ok: torch.Tensor) -> dict[nn.Module, Calls]:
    """Return the calls with the rows outside ``ok`` zeroed (a dropped example adds nothing)."""
    return {m: [Call(zero_rows(c.a, ok), zero_rows(c.g, ok), c.state, c.version)
                for c in calls] for m, calls in layers.items()}


def per_user_layer_refusal(mode: str, layer: str, kind: str) -> str:
    """Return the one-line refusal of a layer whose rule forms no per-user norm."""
    return (f"trainer.grad_sample_mode={mode}: layer {layer} ({kind}) has no per-user rule "
            "(privacy.unit=user with privacy.user_strategy=uls clips each user's gradient "
            "sum); use trainer.grad_sample_mode=hooks or functorch")


def bk_per_user_unsupported(model: nn.Module) -> str | None:
    """Return a one-line reason book-keeping cannot clip ``model`` per user, or None."""
    reason = bk_unsupported(model)
    if reason is not None:
        return reason
    for name, m in trainable_layers(model):
        rule = rule_for(m)
        if rule is not None and not rule.per_user:
            return f"layer {name or type(m).__name__!r}: no per-user rule for {type(m).__name__}"
    return None


def _as_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Return floating ``x`` in ``dtype`` (indices, e.g. an embedding's input, as they are)."""
    return x.to(dtype) if x.is_floating_point() and x.dtype != dtype else x


def _same_tensor(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Return whether ``x`` and ``y`` view the same memory in the same layout (and dtype)."""
    return (x.data_ptr() == y.data_ptr() and x.shape == y.shape and x.stride() == y.stride()
            and x.dtype == y.dtype and x.device == y.device)

