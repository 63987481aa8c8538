"""Bounded adaptive clipping (Zhao, Rehn, Heikkila, Tajeddine, Honkela 2025, arXiv 2506.01396).

Andrew et al.'s adaptive clipping (``adaclip``) with a floor on the threshold:
C_{t+1} = max(C_LB, C_t exp(-eta_C (b_t - gamma))) (Eq. 3), so C_t >= C_LB always and the
threshold cannot vanish once the majority's gradients shrink. The floor is applied to the
post-processed threshold only: privacy is that of ``adaclip`` (account with sigma).
"""

from __future__ import annotations

from typing import Any

from dpbench.errors import ConfigError
from dpbench.methods import register_method
from dpbench.methods.adaclip import AdaClip
from dpbench.methods.base import RunInfo


@register_method("bounded_adaclip")
class BoundedAdaClip(AdaClip):
    """Adaptive clipping whose threshold never goes below ``clip_floor`` (C_LB, default 0.1)."""

    @classmethod
    def settings_defaults(cls) -> dict[str, Any]:
        return {**super().settings_defaults(), "clip_floor": 0.1}

    def clip_floor(self) -> float:
        return float(self.settings["clip_floor"])

    def validate(self, info: RunInfo) -> None:
        floor = self.settings["clip_floor"]
        if not isinstance(floor, (int, float)) or floor < 0:
            raise ConfigError(f"method.settings.clip_floor must be a number >= 0 "
                              f"(got {floor!r})")
        super().validate(info)
