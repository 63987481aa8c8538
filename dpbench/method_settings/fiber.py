"""``method.settings`` of FIBER (``dpbench/methods/fiber.py``, ``conf/method/fiber.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass

from dpbench.method_settings import register_settings
from dpbench.method_settings.base import require
from dpbench.method_settings.disk import DiSKSettings

FILTERS = ("innovation", "ema")
CORRECTIONS = ("filter_aware", "standard", "none")


@register_settings("fiber")
@dataclass(frozen=True)
class FiberSettings(DiSKSettings):
    """``method.settings`` of FIBER: DiSK's observation (kappa, gamma) plus the filter."""

    omega: float = 0.5  # innovation gain; A(omega) = (2-omega)/(4-3omega)
    filter: str = "innovation"  # innovation | ema (ablation)
    correction: str = "filter_aware"  # filter_aware | standard | none (ablation)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(0 < self.omega <= 1, "omega", "in (0, 1]", self.omega)
        require(self.filter in FILTERS, "filter", f"one of {FILTERS}", self.filter)
        require(self.correction in CORRECTIONS, "correction", f"one of {CORRECTIONS}",
                self.correction)
