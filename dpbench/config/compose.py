"""Compose the configuration in-process exactly as the ``dpbench`` command does."""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig

from dpbench.config.entry import prepare_hydra
from dpbench.errors import ConfigError
from dpbench.utils.conf import CONF_DIR


def compose_config(overrides: Sequence[str] = (), config_name: str = "config") -> DictConfig:
    """Return ``conf/<config_name>.yaml`` composed with ``overrides`` (schemas registered).

    An unknown group option, a key that does not exist or a value of the wrong type is a
    ConfigError in one line, naming the overrides (the Hydra error is its cause).
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    prepare_hydra()
    overrides = list(overrides)
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return compose(config_name, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        raise ConfigError(f"{' / '.join(lines)} (overrides: {' '.join(overrides)})") from err
