"""The one Hydra entry every ``dpbench`` console script composes through.

A composed config needs two registrations that live in code, not in ``conf/``: the structured
schemas (``trainer/trainer_schema``, ``privacy/privacy_schema``, ``method/settings/<name>``)
and the ``${path_component:...}`` resolver of the run-folder templates. Registering them as a
side effect of importing some module made ``dpbench-audit`` fail from a fresh shell; here they
are registered by the function that every entry point calls before Hydra composes. Each
console script's ``main`` also calls ``check_command_line``: Hydra instantiates callbacks and
logging factories before the task runs, so they are checked against the allow-list first.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import hydra
from omegaconf import DictConfig

from dpbench.config.help import help_request, print_help
from dpbench.config.hydra_guard import check_hydra_command
from dpbench.config.schema import register_schemas
from dpbench.errors import ConfigError
from dpbench.utils.conf import CONF_DIR
from dpbench.utils.mac import freeze_key
from dpbench.utils.paths import register_path_resolver

#: Hydra's flags that print and run no job
_PRINT_ONLY = frozenset({"--help", "--hydra-help", "--version", "--cfg", "--info",
                         "--shell-completion", "--resolve"})


def prepare_hydra() -> None:
    """Register the schemas and resolvers a dpbench config needs (idempotent)."""
    register_schemas()
    register_path_resolver()


def check_command_line(config_name: str, program: str, calling_module: str) -> None:
    """Refuse, before ``hydra.main`` runs anything, a command line whose composed config asks
    Hydra to run code (``hydra_guard``), or a user without a usable MAC key (``freeze_key``):
    one line ``PROGRAM: error: ...``, exit 2.

    Each console script's ``main`` calls it ahead of its ``hydra_entry`` function.
    """
    prepare_hydra()
    try:
        # the MAC key is the user's: read once, now, before any config can touch the
        # environment (a job's hydra.job.env_set is refused by the guard as well); a command
        # that only prints (--help, --cfg, --info, ...) runs no job and needs none
        if not any(arg.split("=")[0] in _PRINT_ONLY or arg in ("-h", "-c", "-i")
                   for arg in sys.argv[1:]):
            freeze_key(create=True)
        check_hydra_command(sys.argv[1:], CONF_DIR, config_name, calling_module)
    except ConfigError as err:
        print(f"{program}: error: {err}", file=sys.stderr)
        sys.exit(2)


def hydra_entry(config_name: str) -> Callable[[Callable[[DictConfig], None]], Callable[..., Any]]:
    """Return ``hydra.main`` for ``conf/<config_name>.yaml`` that prepares Hydra first.

    Use it instead of ``@hydra.main`` for every console script that composes a run.
    """

    def decorate(task: Callable[[DictConfig], None]) -> Callable[..., Any]:
        hydra_task = hydra.main(version_base="1.3", config_path=CONF_DIR,
                                config_name=config_name)(task)

        def entry(*args: Any, **kwargs: Any) -> Any:
            prepare_hydra()
            asked = help_request(sys.argv[1:]) if not args and not kwargs else None
            if asked is not None:  # Hydra's page, its groups listed without ~100 copies
                print_help(task, CONF_DIR, config_name, *asked)
                sys.exit(0)
            return hydra_task(*args, **kwargs)

        entry.__doc__ = task.__doc__
        entry.__name__ = task.__name__
        return entry

    return decorate
