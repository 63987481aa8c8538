"""``method.settings`` of adaptive clipping.

Its method: ``dpbench/methods/adaclip.py``; its config: ``conf/method/adaclip.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpbench.method_settings import register_settings
from dpbench.method_settings.base import require


@register_settings("adaclip")
@dataclass(frozen=True)
class AdaClipSettings:
    """``method.settings`` of adaptive clipping."""

    target_quantile: float = 0.5  # gamma: target unclipped fraction
    clip_lr: float = 0.2  # eta_C: geometric step size
    sigma_b: float | None = None  # count noise std (in examples); None: B / 10 (paper's scripts)
    count_threshold: float = 1.0  # theta: count 1[||u_i|| <= theta C_t]
    initial_clip: float | None = None  # C_0; None: privacy.clip_norm
    normalize: bool = True  # clip_{C_t}(u) / C_t (sensitivity 1)

    def __post_init__(self) -> None:
        require(0.0 < self.target_quantile < 1.0, "target_quantile", "in (0, 1)",
                self.target_quantile)
        for key in ("clip_lr", "count_threshold"):
            require(getattr(self, key) > 0, key, "> 0", getattr(self, key))
        for key in ("initial_clip", "sigma_b"):
            value = getattr(self, key)
            require(value is None or value > 0, key, "> 0 or null", value)
