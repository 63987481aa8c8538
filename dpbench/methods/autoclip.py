"""AUTO-S automatic clipping (Bu, Wang, Zha, Karypis 2023, "Automatic Clipping", Eq. 4.1).

Every per-example gradient is scaled by 1 / (||u_i|| + r) with the stability constant
r = 0.01, so ||u_i|| / (||u_i|| + r) < 1: sensitivity 1 and no clipping threshold to tune.
"""

from __future__ import annotations

from typing import Any

import torch

from dpbench.errors import ConfigError
from dpbench.methods import register_method
from dpbench.methods.base import DPMethod, RunInfo, StepContext


@register_method("autoclip")
class AutoClip(DPMethod):
    """AUTO-S: per-example factor 1 / (||u_i|| + r); the optimiser comes from the YAML."""

    @classmethod
    def settings_defaults(cls) -> dict[str, Any]:
        return {"stability": 0.01}  # r in Bu et al. Eq. 4.1

    def validate(self, info: RunInfo) -> None:
        r = self.settings["stability"]
        if not isinstance(r, (int, float)) or r <= 0:
            raise ConfigError(f"method.settings.stability must be > 0 (got {r!r})")

    def clip_factors(self, norms: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Return 1 / (||u_i|| + r)."""
        return 1.0 / (norms + float(self.settings["stability"]))

    def sensitivity(self, ctx: StepContext) -> float:
        """Return 1: ||u_i|| / (||u_i|| + r) < 1."""
        return 1.0
