"""DP-aware AdaLN-Zero (Huang et al., arXiv 2602.22610): DP-Adam on the bounded DiT.

The method is model-side only: ``configure_model`` switches on the bounds of ``model=dit``
(c~ = c min(1, c_max / ||c||), gamma/beta/alpha = M tanh(. / M)); the release is DP-SGD's, so
the privacy cost is unchanged. The same bounds compose with any optimiser-side method through
the model option: ``model=dit model.dp_aware=true method=<any>``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from dpbench.errors import ConfigError
from dpbench.method_settings.dp_adaln import DPAdaLNSettings
from dpbench.methods import register_method
from dpbench.methods.base import DPMethod


def set_model_bounds(model: nn.Module, enabled: bool, **bounds: Any) -> nn.Module:
    """Switch the DP-aware bounds of a ``model=dit`` model; ConfigError for other models."""
    if not hasattr(model, "set_dp_aware"):
        raise ConfigError(f"this method needs model=dit (a model with DP-aware AdaLN bounds); "
                          f"got {type(model).__name__}")
    model.set_dp_aware(enabled, **bounds)
    return model


def bounded(model: nn.Module, settings: DPAdaLNSettings) -> nn.Module:
    """Return the DiT with its DP-aware bounds on; bounds left null come from the model config."""
    return set_model_bounds(model, True, **dataclasses.asdict(settings))


DP_ADALN = register_method(DPMethod("dp_adaln", DPAdaLNSettings(),
                                    tasks=frozenset({"ts_diffusion"}), configure_model=bounded))
