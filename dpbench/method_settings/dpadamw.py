"""DP-AdamW has no ``method.settings``.

Its method: ``dpbench/methods/dpadamw.py``; its config: ``conf/method/dpadamw.yaml``.
"""

from __future__ import annotations

from dpbench.method_settings import register_settings
from dpbench.method_settings.base import NoSettings

register_settings("dpadamw")(NoSettings)
