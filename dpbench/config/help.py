"""``--help`` of the Hydra console scripts: Hydra's page, listed from one config repository.

Hydra's ``--help`` lists the config groups by asking its config loader for each group's
options, and the loader copies its whole config repository (every structured config in the
ConfigStore) for each question: about 116 copies for dpbench's groups, most of a second of
wall time. The listing reads the repository and changes nothing in it (the copy guards
against a primary config's ``hydra.searchpath``, which a listing without a primary config
never reads), so ``print_help`` asks the repository itself, once per question, and prints the
same page: the same template (``hydra.help.template``: ``$FLAGS_HELP``,
``$APP_CONFIG_GROUPS``, ``$HYDRA_CONFIG_GROUPS``, ``$CONFIG``), the same composition, the
same sorting. ``tests/test_startup.py`` compares the page with Hydra's own, in a fresh
process.

Only the plain forms are served here: ``--help`` or ``-h`` with overrides and ``--resolve``.
Any other flag beside them (``--config-name``, ``--config-dir``, ``--hydra-help``, ...) goes
to Hydra unchanged.
"""

from __future__ import annotations

import copy
import string
import sys
from collections.abc import Callable, Sequence
from typing import Any

#: the flags this page serves; anything else starting with "-" is Hydra's to handle
_HELP = ("--help", "-h")
_ALLOWED = frozenset({*_HELP, "--resolve"})


def help_request(argv: Sequence[str]) -> tuple[list[str], bool] | None:
    """Return (overrides, resolve) when ``argv`` asks only for the app's help, else None."""
    if not any(arg in _HELP for arg in argv):
        return None
    if any(arg.startswith("-") and arg not in _ALLOWED for arg in argv):
        return None
    return [arg for arg in argv if not arg.startswith("-")], "--resolve" in argv


def _group_lister(repository: Any) -> Callable[[Callable[[str], bool]], str]:
    """Return Hydra's ``format_config_groups`` over ``repository`` (not a copy of it)."""
    from hydra.core.object_type import ObjectType

    def options(group: str, kind: ObjectType = ObjectType.CONFIG) -> list[str]:
        return repository.get_group_options(group, kind)

    def all_groups(parent: str = "") -> list[str]:
        groups: list[str] = []
        for group in options(parent, ObjectType.GROUP):
            name = group if parent == "" else f"{parent}/{group}"
            if options(name, ObjectType.CONFIG):
                groups.append(name)
            if options(name, ObjectType.GROUP):
                groups.extend(all_groups(name))
        return groups

    def formatted(predicate: Callable[[str], bool]) -> str:
        return "".join(f"{group}: {', '.join(sorted(options(group)))}\n"
                       for group in sorted(g for g in all_groups() if predicate(g)))

    return formatted


def _is_hydra_group(group: str) -> bool:
    return group.startswith("hydra/") or group == "hydra"


def print_help(task: Callable[..., Any], config_path: str, config_name: str,
               overrides: list[str], resolve: bool) -> None:
    """Print the ``--help`` page Hydra prints for ``hydra.main(config_path, config_name)`` of
    ``task`` with ``overrides``: composed as Hydra's ``app_help`` composes it."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import (
        create_automatic_config_search_path,
        detect_calling_file_or_module_from_task_function,
        detect_task_name,
        get_args_parser,
    )
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    calling_file, calling_module = detect_calling_file_or_module_from_task_function(task)
    search_path = create_automatic_config_search_path(calling_file, calling_module,
                                                      config_path)
    hydra = Hydra.create_main_hydra2(task_name=detect_task_name(calling_file, calling_module),
                                     config_search_path=search_path)
    try:
        cfg = hydra.compose_config(config_name=config_name, overrides=overrides,
                                   run_mode=RunMode.RUN, with_log_configuration=True)
        HydraConfig.instance().set_config(cfg)
        template = string.Template(cfg.hydra.help.template)
        groups = _group_lister(hydra.config_loader.repository)
        clean = hydra.get_sanitized_cfg(copy.deepcopy(cfg), "job")
        print(template.substitute(
            FLAGS_HELP=hydra.format_args_help(get_args_parser()),
            HYDRA_CONFIG_GROUPS=groups(_is_hydra_group),
            APP_CONFIG_GROUPS=groups(lambda group: not _is_hydra_group(group)),
            CONFIG=OmegaConf.to_yaml(clean, resolve=resolve)))
    finally:
        GlobalHydra.instance().clear()
    sys.stdout.flush()
