"""The audit's composed config, as ``dpbench-audit`` composes it (quiet, CPU)."""

from __future__ import annotations

from hydra import compose, initialize_config_dir

from dpbench.utils.conf import CONF_DIR
from tests.helpers.cli import QUIET_CLI


def audit_config(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("audit", overrides=[*QUIET_CLI, *overrides])
