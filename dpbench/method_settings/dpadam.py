"""DP-Adam has no ``method.settings``.

Its method: ``dpbench/methods/dpadam.py``; its config: ``conf/method/dpadam.yaml``.
"""

from __future__ import annotations

from dpbench.method_settings import register_settings
from dpbench.method_settings.base import NoSettings

register_settings("dpadam")(NoSettings)
