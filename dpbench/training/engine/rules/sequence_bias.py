"""Book-keeping's rule for Opacus's ``SequenceBias``: a learned bias appended to the sequence.

``y_i = [x_i; b]`` along the token axis (batch first): the concatenation's backward gives
example i's gradient of b as its output gradient at the appended position, ``g_i[-1]``, never
a sum over examples (the chain rule through a concatenation).
"""

from __future__ import annotations

from torch import nn

from dpbench.training.engine.rules.base import (
    Calls,
    InstantiatedRule,
    Tensor,
    added,
    layer_rule,
)


@layer_rule("opacus.layers.dp_multihead_attention.SequenceBias")
class SequenceBiasRule(InstantiatedRule):
    parameters = frozenset({"bias"})

    def grads(self, m: nn.Module, calls: Calls) -> dict[nn.Parameter, Tensor]:
        """Return per-example grads of the bias appended as the last token: ``g_i[-1]``."""
        out = added([c.g[:, -1] for c in calls])
        return {m.bias: out} if m.bias.requires_grad else {}

    def check(self, m: nn.Module, cls: type) -> str | None:
        """Refuse the time-first SequenceBias: its output has the sequence, not the example,
        on dim 0."""
        return None if m.batch_first else "SequenceBias(batch_first=False) is time-first"
