"""DP-LoRA has no ``method.settings``.

Its method: ``dpbench/methods/dplora.py``; its config: ``conf/method/dplora.yaml``.
"""

from __future__ import annotations

from dpbench.method_settings import register_settings
from dpbench.method_settings.base import NoSettings

register_settings("dplora")(NoSettings)
