"""``method.settings`` of DP-aware AdaLN-Zero.

Its method: ``dpbench/methods/dp_adaln.py``; its config: ``conf/method/dp_adaln.yaml``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpbench.method_settings import register_settings
from dpbench.method_settings.base import require


@register_settings("dp_adaln")
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
