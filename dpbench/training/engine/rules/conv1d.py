"""Book-keeping's rule for ``nn.Conv1d``: the ``Conv2d`` rule on a height-1 view.

The 1-d convolution is the 2-d one on a height-1 input with a 1 x k kernel (the padding on
the width only), so its per-example gradients are those of ``conv`` (Bu et al., ICML 2023,
eq. 2, 4 and 5 on patches), reshaped to the Conv1d's weight.
"""

from __future__ import annotations

from torch import nn

from dpbench.training.engine.rules.base import (
    Call,
    Calls,
    Kept,
    LayerRule,
    Tensor,
    UserRows,
    layer_rule,
)
from dpbench.training.engine.rules.conv import (
    conv2d_clipped,
    conv2d_norm_sq,
    conv2d_user_norm_sq,
    padding_refusal,
)


class _Conv1dAs2d:
    """A ``Conv1d`` seen as a ``Conv2d`` of height 1 (kernel 1 x k): what the 2-d rules read.

    ``weight`` is a [O, C/G, 1, k] view of the layer's weight, so its gradients are the
    Conv1d's, reshaped (the 1-d convolution is the 2-d one on a height-1 input).
    """

    def __init__(self, m: nn.Conv1d) -> None:
        self.source = m
        self.weight = m.weight.unsqueeze(2)
        self.bias = m.bias
        self.groups = m.groups
        self.kernel_size = (1, m.kernel_size[0])
        self.stride = (1, m.stride[0])
        self.dilation = (1, m.dilation[0])
        self.padding = m.padding if isinstance(m.padding, str) else (0, m.padding[0])
        self.padding_mode = m.padding_mode
        self._reversed_padding_repeated_twice = [*m._reversed_padding_repeated_twice, 0, 0]

    def back(self, grads: dict) -> dict[nn.Parameter, Tensor]:
        """Return ``grads`` keyed by the Conv1d's own parameters, in their shapes."""
        out = {}
        for p, v in grads.items():
            if p is self.weight:
                lead = v.shape[:v.dim() - self.weight.dim()]
                out[self.source.weight] = v.reshape(*lead, *self.source.weight.shape)
            else:
                out[p] = v
        return out


def _as_2d_calls(calls: Calls) -> Calls:
    return [Call(c.a.unsqueeze(2), c.g.unsqueeze(2), c.state) for c in calls]


@layer_rule(nn.Conv1d)
class Conv1dRule(LayerRule):
    def norm_sq(self, m: nn.Conv1d, calls: Calls, keep: Kept | None = None) -> Tensor:
        """Return per-example squared gradient norms (the Conv2d rule, height 1)."""
        view, kept = _Conv1dAs2d(m), {} if keep is not None else None
        out = conv2d_norm_sq(view, _as_2d_calls(calls), kept)
        if kept:
            keep.update(view.back(kept))
        return out

    per_user = True

    def user_norm_sq(self, m: nn.Conv1d, calls: Calls, rows: UserRows) -> Tensor:
        """Return per-user squared gradient norms (the Conv2d rule's, height 1)."""
        return conv2d_user_norm_sq(_Conv1dAs2d(m), _as_2d_calls(calls), rows)

    def clipped(self, m: nn.Conv1d, calls: Calls, f: Tensor) -> dict[nn.Parameter, Tensor]:
        """Return sum_i f_i grad_i (the Conv2d rule, height 1)."""
        view = _Conv1dAs2d(m)
        return view.back(conv2d_clipped(view, _as_2d_calls(calls), f))

    def check(self, m: nn.Module, cls: type) -> str | None:
        return padding_refusal(m, cls)
