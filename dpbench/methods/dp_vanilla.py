"""DP-vanilla (Huang et al., arXiv 2602.22610 baseline): DP-Adam on the unbounded DiT."""

from __future__ import annotations

from torch import nn

from dpbench.methods import register_method
from dpbench.methods.base import DPMethod
from dpbench.methods.dp_adaln import set_model_bounds


@register_method("dp_vanilla")
class DPVanilla(DPMethod):
    """The same AdaLN-Zero DiT with the bounds switched off, whatever the model config says."""

    tasks = frozenset({"ts_diffusion"})

    def configure_model(self, model: nn.Module) -> nn.Module:
        return set_model_bounds(model, False)
