"""Bounded adaptive clipping (Zhao, Rehn, Heikkila, Tajeddine, Honkela 2025, arXiv 2506.01396).

Andrew et al.'s adaptive clipping (``adaclip``) with a floor on the threshold:
C_{t+1} = max(C_LB, C_t exp(-eta_C (b_t - gamma))) (Eq. 3), so C_t >= C_LB always and the
threshold cannot vanish once the majority's gradients shrink. The floor is applied to the
post-processed threshold only: privacy is that of ``adaclip`` (account with sigma).
"""

from __future__ import annotations

import dataclasses

from dpbench.method_settings.bounded_adaclip import BoundedAdaClipSettings
from dpbench.methods import register_method
from dpbench.methods.adaclip import ADACLIP, AdaptiveClipping


class BoundedAdaptiveClipping(AdaptiveClipping):
    """Adaptive clipping whose threshold update (``advance``) has the floor C_LB =
    ``clip_floor`` (post-processing of the noisy count: the release is adaclip's)."""

    def clip_floor(self) -> float:
        return self.settings.clip_floor


#: adaptive clipping whose threshold never goes below ``clip_floor`` (C_LB, default 0.1)
BOUNDED_ADACLIP = register_method(dataclasses.replace(
    ADACLIP, name="bounded_adaclip", settings=BoundedAdaClipSettings(),
    mechanism_cls=BoundedAdaptiveClipping))
