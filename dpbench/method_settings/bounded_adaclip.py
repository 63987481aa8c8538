"""``method.settings`` of bounded adaptive clipping.

Its method: ``dpbench/methods/bounded_adaclip.py``;
its config: ``conf/method/bounded_adaclip.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpbench.method_settings import register_settings
from dpbench.method_settings.adaclip import AdaClipSettings
from dpbench.method_settings.base import require


@register_settings("bounded_adaclip")
@dataclass(frozen=True)
class BoundedAdaClipSettings(AdaClipSettings):
    """``method.settings`` of bounded adaptive clipping: adaclip's plus the floor."""

    clip_floor: float = 0.1  # C_LB (the paper's heuristic); 0 gives adaclip

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.clip_floor >= 0, "clip_floor", "a number >= 0", self.clip_floor)
