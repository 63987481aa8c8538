"""Book-keeping's rules for normalisation layers' affine parameters: ``LayerNorm``,
``GroupNorm``, ``RMSNorm`` and timm's ``LayerNorm`` and ``LayerNorm2d`` (over the channels of
NCHW).

``y = x_hat * weight + bias``: example i's gradients are ``sum x_hat_i g_i`` and ``sum g_i``
over the positions the parameters are broadcast over (the affine map of layer normalisation,
Ba et al. 2016; of group normalisation, Wu and He 2018; of RMSNorm, Zhang and Sennrich 2019,
whose x_hat is x / RMS(x)), instantiated (the parameters are small), summed over the calls.
timm's ``LayerNorm`` runs ``F.layer_norm``, the same equations.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from dpbench.training.engine.rules.base import (
    Calls,
    InstantiatedRule,
    Tensor,
    accumulate,
    layer_rule,
)


@layer_rule(nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, "timm.layers.norm.LayerNorm")
class NormRule(InstantiatedRule):
    #: whether the normalisation runs over dim 1 of an NCHW input (timm's LayerNorm2d)
    channels_first = False

    def normalised(self, m: nn.Module, a: Tensor) -> tuple[Tensor, tuple[int, ...]]:
        """Return (x_hat, the dims the affine gradients sum over besides the example's)."""
        if isinstance(m, nn.GroupNorm):
            return F.group_norm(a, m.num_groups, eps=m.eps), tuple(range(2, a.dim()))
        if isinstance(m, nn.RMSNorm):
            x_hat = F.rms_norm(a, m.normalized_shape, eps=m.eps)
            return x_hat, tuple(range(1, a.dim() - len(m.normalized_shape)))
        if self.channels_first:  # timm LayerNorm2d: over C of [B, C, H, W]
            x_hat = F.layer_norm(a.permute(0, 2, 3, 1), m.normalized_shape, eps=m.eps)
            return x_hat.permute(0, 3, 1, 2), tuple(range(2, a.dim()))
        return (F.layer_norm(a, m.normalized_shape, eps=m.eps),
                tuple(range(1, a.dim() - len(m.normalized_shape))))

    def grads(self, m: nn.Module, calls: Calls) -> dict[nn.Parameter, Tensor]:
        """Return per-example grads [B, *param.shape] of the affine parameters."""
        out: dict[nn.Parameter, Tensor] = {}
        weight, bias = getattr(m, "weight", None), getattr(m, "bias", None)
        for c in calls:
            x_hat, dims = self.normalised(m, c.a)
            g = c.g
            terms = {}
            if weight is not None and weight.requires_grad:
                terms[weight] = (x_hat * g).sum(dims) if dims else x_hat * g
            if bias is not None and bias.requires_grad:
                terms[bias] = g.sum(dims) if dims else g
            accumulate(out, terms)
        return out


@layer_rule("timm.layers.norm.LayerNorm2d")
class ChannelsFirstNormRule(NormRule):
    """timm's ``LayerNorm2d``: layer normalisation over the channels of NCHW."""

    channels_first = True
