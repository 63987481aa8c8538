"""DP-vanilla (Huang et al., arXiv 2602.22610 baseline): DP-Adam on the unbounded DiT."""

from __future__ import annotations

from torch import nn

from dpbench.methods import register_method
from dpbench.methods.base import DPMethod
from dpbench.methods.dp_adaln import set_model_bounds


def unbounded(model: nn.Module, settings: object) -> nn.Module:
    """Return the AdaLN-Zero DiT with its bounds switched off, whatever the model config says."""
    return set_model_bounds(model, False)


DP_VANILLA = register_method(DPMethod("dp_vanilla", tasks=frozenset({"ts_diffusion"}),
                                      configure_model=unbounded))
