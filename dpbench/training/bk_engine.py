"""Book-keeping clipping (``trainer.grad_sample_mode=bk``): clipped sums in one backward.

Bu, Wang, Zha and Karypis, "Differentially private optimization on large model at small
cost" (ICML 2023). One forward pass records each trainable layer's input ``a``; one backward
(``torch.autograd.grad`` of the summed loss with respect to the layers' *outputs*, so no
parameter gradient is formed) yields the output gradients ``g``. Then, per layer
(``bk_layers``):

1. per-example squared norms by the ghost norm or by instantiation, whichever is cheaper;
   ``||g_i||^2 = sum_layers ||G_i^l||^2``;
2. the method's clip factors ``f_i = factors_fn(||g_i||)``;
3. ``sum_i f_i G_i^l`` from the book-kept ``a`` and the re-weighted ``f_i g_i`` (one matmul /
   weight-gradient call per layer).

Neither a second backward (ghost clipping) nor a B x params tensor (Opacus hooks) is made.
The engine has the interface of ``PerExampleGradients`` in ghost mode: methods that need only
norms and factors use it; multi-point methods keep materialised per-example gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from dpbench.errors import ConfigError
from dpbench.training.bk_layers import rule_for, unsupported_reason

LossFn = Callable[[nn.Module, Any], torch.Tensor]


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


class BookKeepingGradients:
    """Hooks a model once; returns clipped sums, norms and factors from one backward."""

    mode = "bk"

    def __init__(self, model: nn.Module) -> None:
        reason = bk_unsupported(model)
        if reason is not None:
            raise ConfigError(f"trainer.grad_sample_mode=bk cannot run this model ({reason}); "
                              "use trainer.grad_sample_mode=hooks or auto")
        self.module = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self._recording = False
        self._records: list[tuple[nn.Module, torch.Tensor, torch.Tensor, int]] = []
        named = trainable_layers(model)
        layers = [m for _, m in named]
        self._layer_names = {m: name for name, m in named}
        self._layer_norm_sq: dict[nn.Module, torch.Tensor] = {}
        self._rules = {m: rule_for(m) for m in layers}
        self._own = {m: [p for p in m.parameters(recurse=False) if p.requires_grad]
                     for m in layers}
        # first of the forward hooks: the layer's own output is recorded, before any hook of
        # the model's replaces it (the rules need the gradient with respect to that output)
        self._handles = [m.register_forward_hook(self._record, prepend=True) for m in layers]

    def _record(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        if self._recording and torch.is_grad_enabled() and output.requires_grad:
            self._records.append((module, inputs[0].detach(), output, output._version))

    def _name(self, module: nn.Module) -> str:
        return repr(self._layer_names.get(module) or type(module).__name__)

    def per_example(self, loss_fn: LossFn, batch) -> tuple[list[torch.Tensor], torch.Tensor]:
        raise ConfigError("book-keeping forms clipped sums, not per-example gradients; this "
                          "method needs them: use trainer.grad_sample_mode=hooks (or auto)")

    def _forward_backward(self, loss_fn: LossFn, batch):
        """Return (losses, loss finite mask, {module: (a, g)}) after one forward + backward."""
        self._records = []
        self._recording = True
        try:
            losses = loss_fn(self.module, batch)
        finally:
            self._recording = False
        records, self._records = self._records, []
        total = losses.sum()
        finite = None  # None: every loss is finite (one check of the sum, not B)
        if not bool(torch.isfinite(total)):
            # a non-finite loss contributes 0: masked before the backward (and its factor is 0)
            finite = torch.isfinite(losses.detach())
            total = torch.where(finite, losses, torch.zeros_like(losses)).sum()
        n = losses.shape[0] if losses.dim() else 0
        for module, a, out, version in records:
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
        layers: dict[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for (module, a, _, _), g in zip(records, grads):
            if g is not None:  # bf16-mixed: norms and sums in the parameters' float32
                dtype = self._own[module][0].dtype
                layers.setdefault(module, []).append((_as_dtype(a, dtype), _as_dtype(g, dtype)))
        return losses.detach(), finite, {m: self._merge(m, calls) for m, calls in layers.items()}

    def _merge(self, module: nn.Module, calls: list[tuple[torch.Tensor, torch.Tensor]]):
        """Return one (a, g) per layer; a layer called k times has G_i = sum of k terms."""
        if len(calls) == 1:
            return calls[0]
        if not self._rules[module].concat_calls:
            raise ConfigError(f"book-keeping: layer {self._name(module)} is called "
                              f"{len(calls)} times in one forward; use "
                              "trainer.grad_sample_mode=hooks")
        b = calls[0][0].shape[0]
        a = torch.cat([c[0].reshape(b, -1, c[0].shape[-1]) for c in calls], dim=1)
        g = torch.cat([c[1].reshape(b, -1, c[1].shape[-1]) for c in calls], dim=1)
        return a, g

    def ghost_clipped_sum(
        self, loss_fn: LossFn, batch, factors_fn: Callable[[torch.Tensor], torch.Tensor]
    ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return (sum_i f_i g_i per parameter, norms, factors, kept losses, kept); no g_i built.

        The interface of ``PerExampleGradients.ghost_clipped_sum``: an example whose loss or
        norm is non-finite is dropped (norm and factor 0, ``kept`` False, its loss left out);
        its loss is masked before the single backward and its rows are zeroed before the
        clipped sums (0 * inf would be NaN), so no second pass is needed.
        """
        losses, finite, layers = self._forward_backward(loss_fn, batch)
        kept_grads: dict[nn.Parameter, torch.Tensor] = {}  # instantiated per-example grads
        self._layer_norm_sq = {m: self._rules[m].norm_sq(m, a, g, kept_grads)
                               for m, (a, g) in layers.items()}
        norm_sq = sum(self._layer_norm_sq.values()) if layers else torch.zeros_like(losses)
        norms = norm_sq.sqrt()
        if finite is None and bool(torch.isfinite(norm_sq.sum())):
            factors = factors_fn(norms).to(norms.dtype)
            kept = torch.ones(len(norms), dtype=torch.bool)
        else:  # NaN/Inf example: contributes exactly 0 (its rows zeroed too: 0 * inf is NaN)
            ok = torch.isfinite(norms) if finite is None else finite & torch.isfinite(norms)
            norms = torch.where(ok, norms, torch.zeros_like(norms))
            factors = torch.where(ok, factors_fn(norms).to(norms.dtype), torch.zeros_like(norms))
            layers = {m: (_zero_rows(a, ok), _zero_rows(g, ok)) for m, (a, g) in layers.items()}
            self._layer_norm_sq = {m: torch.where(ok, v, torch.zeros_like(v))
                                   for m, v in self._layer_norm_sq.items()}
            kept_grads = {p: _zero_rows(v, ok) for p, v in kept_grads.items()}
            kept = ok.cpu()
            losses = losses[ok]
        sums = {p: torch.einsum("b,b...->...", factors, v) for p, v in kept_grads.items()}
        for module, (a, g) in layers.items():
            if not all(p in kept_grads for p in self._own[module]):
                sums.update(self._rules[module].clipped(module, a, g, factors))
        zeros = torch.zeros_like
        out = [sums[p] if p in sums else zeros(p) for p in self.params]
        return out, norms, factors, losses, kept

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


def _as_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Return floating ``x`` in ``dtype`` (indices, e.g. an embedding's input, as they are)."""
    return x.to(dtype) if x.is_floating_point() and x.dtype != dtype else x


def _zero_rows(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    if not x.is_floating_point():  # embedding indices
        return x
    return torch.where(keep.view(-1, *([1] * (x.dim() - 1))), x, torch.zeros_like(x))
