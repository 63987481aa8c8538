"""DP-SGD (Abadi et al. 2016, Alg. 1): flat clipping, one Gaussian release, SGD update.

``normalize: true`` gives constant *normalised* clipping, clip_C(g_i) / C (sensitivity 1),
the constant-clipping baseline of Zhao et al. 2025 (bounded adaptive clipping).
"""

from __future__ import annotations

import torch

from dpbench.method_settings.dpsgd import DPSGDSettings
from dpbench.methods import register_method
from dpbench.methods.base import DPMethod, Mechanism, StepContext
from dpbench.methods.mechanism import flat_clip_factors


class FlatClipping(Mechanism):
    """Clipping at ``clip_threshold(ctx)`` (C), divided by it when ``settings.normalize``."""

    def clip_threshold(self, ctx: StepContext) -> float:
        """Return the step's threshold: C from the privacy config."""
        return ctx.clip_norm

    def clip_factors(self, norms: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Return min(1, C/||u_i||), or min(1, C/||u_i||) / C when normalised."""
        return flat_clip_factors(norms, self.clip_threshold(ctx),
                                 self.settings.normalize)

    def sensitivity(self, ctx: StepContext) -> float:
        """Return C (flat clipping) or 1 (normalised clipping)."""
        return 1.0 if self.settings.normalize else self.clip_threshold(ctx)


#: DP-SGD's mechanism with optional normalisation; the update is the YAML's SGD
DPSGD = register_method(DPMethod("dpsgd", DPSGDSettings(), FlatClipping))
