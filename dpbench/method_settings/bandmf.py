"""``method.settings`` of BandMF (``dpbench/methods/bandmf.py``, ``conf/method/bandmf.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass

from dpbench.errors import ConfigError
from dpbench.method_settings import register_settings
from dpbench.privacy.banded_mf import STRATEGIES
from dpbench.utils.ranges import int_at_least


@register_settings("bandmf")
@dataclass(frozen=True)
class BandMFSettings:
    """``conf/method/bandmf.yaml`` settings: b and the strategy (validated on construction)."""

    bands: int = 4
    strategy: str = "optimal"  # optimal: L-BFGS on ||A C^{-1}||_F^2 | sqrt: truncated A^{1/2}

    def __post_init__(self) -> None:
        int_at_least("method.settings.bands", self.bands, 1)
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"method.settings.strategy must be one of "
                              f"{', '.join(STRATEGIES)} (got {self.strategy!r})")
