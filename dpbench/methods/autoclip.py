"""AUTO-S automatic clipping (Bu, Wang, Zha, Karypis 2023, "Automatic Clipping", Eq. 4.1).

Every per-example gradient is scaled by 1 / (||u_i|| + r) with the stability constant
r = 0.01, so ||u_i|| / (||u_i|| + r) < 1: sensitivity 1 and no clipping threshold to tune.
"""

from __future__ import annotations

import torch

from dpbench.method_settings.autoclip import AutoClipSettings
from dpbench.methods import register_method
from dpbench.methods.base import DPMethod, Mechanism, StepContext


class AutomaticClipping(Mechanism):
    """AUTO-S's clipping: per-example factor 1 / (||u_i|| + r), sensitivity 1."""

    def clip_factors(self, norms: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Return 1 / (||u_i|| + r)."""
        return 1.0 / (norms + self.settings.stability)

    def sensitivity(self, ctx: StepContext) -> float:
        """Return 1: ||u_i|| / (||u_i|| + r) < 1."""
        return 1.0


#: AUTO-S: automatic clipping; the update is the YAML's optimiser
AUTOCLIP = register_method(DPMethod("autoclip", AutoClipSettings(), AutomaticClipping))
