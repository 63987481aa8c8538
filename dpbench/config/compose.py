"""Compose the configuration in-process exactly as the ``dpbench`` command does."""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig

from dpbench.config.schema import register_schemas
from dpbench.utils.conf import CONF_DIR


def compose_config(overrides: Sequence[str] = (), config_name: str = "config") -> DictConfig:
    """Return ``conf/<config_name>.yaml`` composed with ``overrides`` (schemas registered)."""
    from hydra import compose, initialize_config_dir

    register_schemas()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name, overrides=list(overrides))
