"""Compose configs the way the CLI does (quiet, on CPU) and fit a trainer for one."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir

from dpbench.utils.conf import CONF_DIR

REPO = Path(__file__).resolve().parents[2]
QUIET = ["logger=none", "trainer.progress=false", "trainer.device=cpu"]


def compose_config(*overrides: str):
    """Return the composed config for ``overrides`` (quiet, CPU) like ``dpbench`` would."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=[*QUIET, *overrides])


def run_config(cfg, run_dir: Path | None = None) -> dict:
    """Build and fit a trainer for ``cfg``; return its summary."""
    from dpbench.experiment import build_trainer

    return build_trainer(cfg, run_dir).fit()
