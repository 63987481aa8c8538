"""Per-example clipping rules shared by the clipping methods (stage 5, docs/adding-a-method.md)."""

from __future__ import annotations

import torch

#: guards 0/0 for an all-zero per-example gradient
NORM_EPS = 1e-6


def flat_clip_factors(norms: torch.Tensor, threshold: float, normalize: bool) -> torch.Tensor:
    """Return min(1, C / ||g_i||), divided by C when ``normalize`` (sensitivity 1).

    Flat clipping (Abadi et al. 2016): clip_C(g) = g min(1, C / ||g||), sensitivity C.
    Normalised clipping (Zhao et al. 2025, Sec. 3; Andrew et al. 2021): clip_C(g) / C, so
    every contribution has norm <= 1 and the learning rate is decoupled from C.
    """
    factors = (threshold / (norms + NORM_EPS)).clamp(max=1.0)
    return factors / threshold if normalize else factors
