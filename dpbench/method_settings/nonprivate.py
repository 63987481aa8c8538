"""The non-private baseline has no ``method.settings``.

Its method: ``dpbench/methods/nonprivate.py``; its config: ``conf/method/nonprivate.yaml``.
"""

from __future__ import annotations

from dpbench.method_settings import register_settings
from dpbench.method_settings.base import NoSettings

register_settings("nonprivate")(NoSettings)
