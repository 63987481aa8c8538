"""DP-vanilla has no ``method.settings``.

Its method: ``dpbench/methods/dp_vanilla.py``; its config: ``conf/method/dp_vanilla.yaml``.
"""

from __future__ import annotations

from dpbench.method_settings import register_settings
from dpbench.method_settings.base import NoSettings

register_settings("dp_vanilla")(NoSettings)
