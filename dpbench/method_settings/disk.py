"""``method.settings`` of DiSK (``dpbench/methods/disk.py``, ``conf/method/disk.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass

from dpbench.method_settings import register_settings
from dpbench.method_settings.base import require


@register_settings("disk")
@dataclass(frozen=True)
class DiSKSettings:
    """``method.settings`` of DiSK: the observation (and filter) gain and the look-ahead."""

    kappa: float = 0.7  # filter gain, g~ = (1-kappa) g~ + kappa g; 1 = the base optimiser
    gamma: float = 0.5  # look-ahead of the observation: a = (1-kappa)/(kappa gamma)

    def __post_init__(self) -> None:
        require(0 < self.kappa <= 1, "kappa", "in (0, 1]", self.kappa)
        require(self.gamma > 0, "gamma", "> 0", self.gamma)
