"""DP-aware AdaLN-Zero (Huang et al., arXiv 2602.22610): DP-Adam on the bounded DiT.

The method is model-side only: ``configure_model`` switches on the bounds of ``model=dit``
(c~ = c min(1, c_max / ||c||), gamma/beta/alpha = M tanh(. / M)); the release is DP-SGD's, so
the privacy cost is unchanged. The same bounds compose with any optimiser-side method through
the model option: ``model=dit model.dp_aware=true method=<any>``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from torch import nn

from dpbench.errors import ConfigError
from dpbench.methods import register_method
from dpbench.methods.base import DPMethod
from dpbench.methods.settings import require


def set_model_bounds(model: nn.Module, enabled: bool, **bounds: Any) -> nn.Module:
    """Switch the DP-aware bounds of a ``model=dit`` model; ConfigError for other models."""
    if not hasattr(model, "set_dp_aware"):
        raise ConfigError(f"this method needs model=dit (a model with DP-aware AdaLN bounds); "
                          f"got {type(model).__name__}")
    model.set_dp_aware(enabled, **bounds)
    return model


@dataclass(frozen=True)
class DPAdaLNSettings:
    """``method.settings`` of DP-aware AdaLN-Zero: the bounds; null keeps the model's."""

    c_max: float | None = None  # c~ = c min(1, c_max / ||c||)
    m_gamma: float | None = None  # gamma = M_gamma tanh(. / M_gamma)
    m_beta: float | None = None
    m_alpha: float | None = None

    def __post_init__(self) -> None:
        for key in ("c_max", "m_gamma", "m_beta", "m_alpha"):
            value = getattr(self, key)
            require(value is None or 0 < value < math.inf, key, "a finite number > 0 or null",
                    value)


def bounded(model: nn.Module, settings: DPAdaLNSettings) -> nn.Module:
    """Return the DiT with its DP-aware bounds on; bounds left null come from the model config."""
    return set_model_bounds(model, True, **dataclasses.asdict(settings))


DP_ADALN = register_method(DPMethod("dp_adaln", DPAdaLNSettings(),
                                    tasks=frozenset({"ts_diffusion"}), configure_model=bounded))
