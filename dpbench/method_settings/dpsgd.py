"""``method.settings`` of DP-SGD (``dpbench/methods/dpsgd.py``, ``conf/method/dpsgd.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass

from dpbench.method_settings import register_settings


@register_settings("dpsgd")
@dataclass(frozen=True)
class DPSGDSettings:
    """``method.settings`` of DP-SGD."""

    normalize: bool = False  # true: clip_C(g) / C (sensitivity 1, lr decoupled from C)
