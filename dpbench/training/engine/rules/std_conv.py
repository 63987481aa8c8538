"""Book-keeping's rules for timm's weight-standardised convolutions (``StdConv2d``,
``ScaledStdConv2d``).

``W_eff[o] = gain_o * scale * (W[o] - mean W[o]) / s_o``, ``s_o = sqrt(var W[o] + eps)``
(biased variance over the C/G k^2 entries of row o): the weight standardisation of Qiao et al.
2019, "Micro-batch training with batch-channel normalization and weight standardization", as
timm computes it, with the gain and the fan-in scale of Brock et al. 2021, "Characterizing
signal propagation to close the performance gap in unnormalized ResNets". The per-example
gradient of W is the chain rule through this map applied to the ``conv`` rule's gradient of
W_eff (Bu et al., ICML 2023, eq. 2); per user those gradients are summed over the user's rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dpbench.training.engine.rules.base import (
    KEEP_INSTANTIATED_ELEMENTS,
    Calls,
    Kept,
    LayerRule,
    Tensor,
    UserRows,
    accumulate,
    layer_rule,
    sum_sq,
    user_sum_sq,
)
from dpbench.training.engine.rules.conv import (
    conv_bias_grads,
    conv_bias_sum,
    conv_weight_per_example,
    conv_weight_sum,
    padding_refusal,
)


@dataclass(frozen=True)
class Standardisation:
    """The weight standardisation of one output channel per row, at one point (the module
    docstring's map; ``gain_scale`` is None for ``StdConv2d``)."""

    w_hat: Tensor  # [O, n] the standardised rows
    inv_s: Tensor  # [O, 1] 1 / s_o
    gain_scale: Tensor | None  # [O, 1] gain_o * scale
    scale: float


def _std_weight_grads(m: nn.Conv2d, state: Standardisation,
                      g_eff: Tensor) -> dict[nn.Parameter, Tensor]:
    """Return the gradients of W (and gain) from ``g_eff`` [..., O, C/G, kh, kw], the gradient
    with respect to the effective (standardised) weight, through the standardisation's Jacobian.

    Row by row, with ``H = dL/dW_hat`` (``gain scale g_eff`` for ScaledStdConv2d):
    ``dL/dW = (H - mean(H) - W_hat mean(H * W_hat)) / s`` (the normalisation's backward, as for
    LayerNorm: Ba et al. 2016) and ``dL/dgain = scale <W_hat, g_eff>``.
    """
    lead = g_eff.shape[:g_eff.dim() - 4]
    rows = g_eff.reshape(*lead, m.weight.shape[0], -1)
    out = {}
    h = rows if state.gain_scale is None else rows * state.gain_scale
    if m.weight.requires_grad:
        dw = (h - h.mean(-1, keepdim=True)
              - state.w_hat * (h * state.w_hat).mean(-1, keepdim=True)) * state.inv_s
        out[m.weight] = dw.reshape(*lead, *m.weight.shape)
    gain = getattr(m, "gain", None)
    if gain is not None and gain.requires_grad:
        out[gain] = (state.scale * (rows * state.w_hat).sum(-1)).reshape(*lead, *gain.shape)
    return out


def _per_example(m: nn.Conv2d, calls: Calls) -> dict[nn.Parameter, Tensor]:
    out: dict[nn.Parameter, Tensor] = {}
    for c in calls:
        accumulate(out, _std_weight_grads(m, c.state,
                                          conv_weight_per_example(m, [c], m.weight.shape)))
    if m.bias is not None and m.bias.requires_grad:
        out[m.bias] = conv_bias_grads(calls)
    return out


@layer_rule("timm.layers.std_conv.StdConv2d")
class StdConvRule(LayerRule):
    def state(self, m: nn.Conv2d) -> Standardisation:
        """Return the layer's standardisation at its current weights (recorded in the forward)."""
        with torch.no_grad():
            w = m.weight.detach().reshape(m.weight.shape[0], -1)
            var, mean = torch.var_mean(w, dim=1, correction=0, keepdim=True)
            inv_s = torch.rsqrt(var + m.eps)
            gain = getattr(m, "gain", None)
            gain_scale = None if gain is None else gain.detach().reshape(-1, 1) * m.scale
            return Standardisation((w - mean) * inv_s, inv_s, gain_scale,
                                   float(getattr(m, "scale", 1.0)))

    def norm_sq(self, m: nn.Conv2d, calls: Calls, keep: Kept | None = None) -> Tensor:
        """Return per-example squared norms of the gradients.

        Instantiated: each call's per-example gradient with respect to the standardised weight
        (the Conv2d rule's ``g_i P_i^T``) pushed through the Jacobian of its point's
        standardisation (``_std_weight_grads``), summed over the calls.
        """
        grads = _per_example(m, calls)
        if keep is not None and sum(v.numel() for v in grads.values()) \
                <= KEEP_INSTANTIATED_ELEMENTS:
            keep.update(grads)
        return sum_sq(grads, calls)

    per_user = True

    def user_norm_sq(self, m: nn.Conv2d, calls: Calls, rows: UserRows) -> Tensor:
        """Return per-user ||D_u||^2: the instantiated per-example gradients summed per user."""
        return user_sum_sq(_per_example(m, calls), rows, calls)

    def clipped(self, m: nn.Conv2d, calls: Calls, f: Tensor) -> dict[nn.Parameter, Tensor]:
        """Return sum_i f_i grad_i: the Jacobian is the same for every example, so it is applied
        once per call to the re-weighted weight gradient sum_i f_i G_i (linearity)."""
        out: dict[nn.Parameter, Tensor] = {}
        for c in calls:
            accumulate(out, _std_weight_grads(m, c.state,
                                              conv_weight_sum(m, c, f, m.weight.shape)))
        if m.bias is not None and m.bias.requires_grad:
            out[m.bias] = conv_bias_sum(m, calls, f)
        return out

    def check(self, m: nn.Module, cls: type) -> str | None:
        return padding_refusal(m, cls)


@layer_rule("timm.layers.std_conv.ScaledStdConv2d")
class ScaledStdConvRule(StdConvRule):
    """``StdConv2d``'s rule with the learned gain (its gradient ``scale <W_hat, g_eff>``)."""

    parameters = frozenset({"weight", "bias", "gain"})
