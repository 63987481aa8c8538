"""Book-keeping's rule for timm's ``LayerScale``: ``y = x * gamma``.

Example i's gradient of gamma is ``sum_t a_it * g_it`` over the token dims (the product rule,
gamma broadcast over the tokens: LayerScale of Touvron et al. 2021, "Going deeper with image
transformers"), instantiated.
"""

from __future__ import annotations

from torch import nn

from dpbench.training.engine.rules.base import Calls, InstantiatedRule, Tensor, layer_rule


@layer_rule("timm.layers.layer_scale.LayerScale")
class LayerScaleRule(InstantiatedRule):
    parameters = frozenset({"gamma"})

    def grads(self, m: nn.Module, calls: Calls) -> dict[nn.Parameter, Tensor]:
        """Return per-example grads of gamma: sum over the token dims of a_i * g_i."""
        out = None
        for c in calls:
            term = (c.a * c.g).reshape(c.a.shape[0], -1, c.a.shape[-1]).sum(1)
            out = term if out is None else out + term
        return {m.gamma: out} if m.gamma.requires_grad else {}

    def check(self, m: nn.Module, cls: type) -> str | None:
        """Refuse the in-place LayerScale: it overwrites the input the rule reads."""
        return "LayerScale(inplace=True) overwrites its input" if m.inplace else None
