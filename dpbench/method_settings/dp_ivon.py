"""``method.settings`` of DP-IVON (``dpbench/methods/dp_ivon.py``, ``conf/method/dp_ivon.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass

from dpbench.method_settings import register_settings
from dpbench.method_settings.ivon import IVONSettings


@register_settings("dp_ivon")
@dataclass(frozen=True)
class DPIVONSettings(IVONSettings):
    """``method.settings`` of DP-IVON: IVON's, with the noise-corrected gradsq curvature."""

    hess: str = "gradsq"  # gradsq (noise-corrected squared gradient) | reparam (naive ablation)
