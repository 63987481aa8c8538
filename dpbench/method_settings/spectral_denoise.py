"""``method.settings`` of spectral denoising.

Its method: ``dpbench/methods/spectral_denoise.py``;
its config: ``conf/method/spectral_denoise.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpbench.method_settings import register_settings
from dpbench.method_settings.base import require

TARGETS = ("lora", "all_2d")


@register_settings("spectral_denoise")
@dataclass(frozen=True)
class SpectralDenoiseSettings:
    """``method.settings`` of spectral denoising."""

    targets: Any = "lora"  # lora (the A and B factors) | all_2d | [name substrings]
    kappa: float = 1.0  # gate: denoise if the top singular value > kappa s (sqrt n + sqrt m)

    def __post_init__(self) -> None:
        require(self.kappa > 0, "kappa", "a number > 0", self.kappa)
        targets = self.targets
        require(targets in TARGETS if isinstance(targets, str) else
                isinstance(targets, (list, tuple)) and all(isinstance(t, str) for t in targets),
                "targets", f"one of {TARGETS} or a list of parameter-name substrings", targets)
        if isinstance(targets, list):  # frozen all the way down
            object.__setattr__(self, "targets", tuple(targets))
