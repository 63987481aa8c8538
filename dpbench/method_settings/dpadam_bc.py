"""DP-AdamBC has no ``method.settings``.

Its method: ``dpbench/methods/dpadam_bc.py``; its config: ``conf/method/dpadam_bc.yaml``.
"""

from __future__ import annotations

from dpbench.method_settings import register_settings
from dpbench.method_settings.base import NoSettings

register_settings("dpadam_bc")(NoSettings)
