"""The one Hydra entry every ``dpbench`` console script composes through.

A composed config needs two registrations that live in code, not in ``conf/``: the structured
schemas (``trainer/trainer_schema``, ``privacy/privacy_schema``, ``method/settings/<name>``)
and the ``${path_component:...}`` resolver of the run-folder templates. Registering them as a
side effect of importing some module made ``dpbench-audit`` fail from a fresh shell; here they
are registered by the function that every entry point calls before Hydra composes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hydra
from omegaconf import DictConfig

from dpbench.config.schema import register_schemas
from dpbench.utils.conf import CONF_DIR
from dpbench.utils.paths import register_path_resolver


def prepare_hydra() -> None:
    """Register the schemas and resolvers a dpbench config needs (idempotent)."""
    register_schemas()
    register_path_resolver()


def hydra_entry(config_name: str) -> Callable[[Callable[[DictConfig], None]], Callable[..., Any]]:
    """Return ``hydra.main`` for ``conf/<config_name>.yaml`` that prepares Hydra first.

    Use it instead of ``@hydra.main`` for every console script that composes a run.
    """

    def decorate(task: Callable[[DictConfig], None]) -> Callable[..., Any]:
        hydra_task = hydra.main(version_base="1.3", config_path=CONF_DIR,
                                config_name=config_name)(task)

        def entry(*args: Any, **kwargs: Any) -> Any:
            prepare_hydra()
            return hydra_task(*args, **kwargs)

        entry.__doc__ = task.__doc__
        entry.__name__ = task.__name__
        return entry

    return decorate
