"""DP-SGD (Abadi et al. 2016, Alg. 1): flat clipping, one Gaussian release, SGD update.

``normalize: true`` gives constant *normalised* clipping, clip_C(g_i) / C (sensitivity 1),
the constant-clipping baseline of Zhao et al. 2025 (bounded adaptive clipping).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dpbench.methods import register_method
from dpbench.methods.base import DPMethod, StepContext
from dpbench.methods.clipping import flat_clip_factors


@dataclass
class DPSGDSettings:
    """``method.settings`` of DP-SGD."""

    normalize: bool = False  # true: clip_C(g) / C (sensitivity 1, lr decoupled from C)


@register_method("dpsgd")
class DPSGD(DPMethod):
    """Every stage but clipping is the base class's default; SGD comes from the YAML."""

    settings_cls = DPSGDSettings

    def clip_factors(self, norms: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Return min(1, C/||u_i||), or min(1, C/||u_i||) / C when normalised."""
        return flat_clip_factors(norms, ctx.clip_norm, bool(self.settings["normalize"]))

    def sensitivity(self, ctx: StepContext) -> float:
        """Return C (flat clipping) or 1 (normalised clipping)."""
        return 1.0 if self.settings["normalize"] else ctx.clip_norm
