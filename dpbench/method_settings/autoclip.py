"""``method.settings`` of AUTO-S.

Its method: ``dpbench/methods/autoclip.py``; its config: ``conf/method/autoclip.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpbench.method_settings import register_settings
from dpbench.method_settings.base import require


@register_settings("autoclip")
@dataclass(frozen=True)
class AutoClipSettings:
    """``method.settings`` of AUTO-S."""

    stability: float = 0.01  # r in Bu et al. Eq. 4.1: factor 1 / (||u_i|| + r)

    def __post_init__(self) -> None:
        require(self.stability > 0, "stability", "> 0", self.stability)
