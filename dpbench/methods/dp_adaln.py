"""DP-aware AdaLN-Zero (Huang et al., arXiv 2602.22610): DP-Adam on the bounded DiT.

The method is model-side only: ``configure_model`` switches on the bounds of ``model=dit``
(c~ = c min(1, c_max / ||c||), gamma/beta/alpha = M tanh(. / M)); the release is DP-SGD's, so
the privacy cost is unchanged. The same bounds compose with any optimiser-side method through
the model option: ``model=dit model.dp_aware=true method=<any>``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from dpbench.errors import ConfigError
from dpbench.methods import register_method
from dpbench.methods.base import DPMethod


def set_model_bounds(model: nn.Module, enabled: bool, **bounds: Any) -> nn.Module:
    """Switch the DP-aware bounds of a ``model=dit`` model; ConfigError for other models."""
    if not hasattr(model, "set_dp_aware"):
        raise ConfigError(f"this method needs model=dit (a model with DP-aware AdaLN bounds); "
                          f"got {type(model).__name__}")
    model.set_dp_aware(enabled, **bounds)
    return model


@register_method("dp_adaln")
class DPAdaLN(DPMethod):
    """DP-aware AdaLN-Zero; bounds left null here come from the model config."""

    tasks = frozenset({"ts_diffusion"})

    @classmethod
    def settings_defaults(cls) -> dict[str, Any]:
        return {"c_max": None, "m_gamma": None, "m_beta": None, "m_alpha": None}

    def configure_model(self, model: nn.Module) -> nn.Module:
        return set_model_bounds(model, True, **self.settings)
