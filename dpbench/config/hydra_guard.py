"""Check what Hydra itself will instantiate before ``hydra.main`` runs anything.

Hydra runs some config values as code before the task function starts: it instantiates every
``hydra.callbacks`` entry (``_target_``) and hands ``hydra.job_logging`` and
``hydra.hydra_logging`` to ``logging.config.dictConfig``, which calls any ``"()"`` factory,
imports any handler ``class`` and resolves any ``ext://`` name. A check inside the task comes
too late, so the console scripts call ``check_hydra_command`` first: it composes the
configuration exactly as ``hydra.main`` will (the same argument parser, search path,
``--config-dir`` and run mode; in a sweep also each value of every swept option) and raises
ConfigError naming the key of the first value that is not allowed
(docs/reliability-bad-input.md, "What Hydra runs"):

- ``hydra.callbacks``: each ``_target_`` must pass the allow-list (``config.targets``);
- ``hydra.job_logging`` / ``hydra.hydra_logging``: a ``"()"`` factory must pass the same
  allow-list; a handler's ``class`` must be ``logging.StreamHandler`` or
  ``logging.NullHandler`` (a file handler could write or truncate any file the user can:
  dpbench writes ``run.log`` itself); a formatter's ``class`` must be ``logging.Formatter``;
  an ``ext://`` value may name only ``sys.stdout`` or ``sys.stderr``;
- ``hydra.output_subdir`` must stay null (Hydra would write its config files there before
  dpbench validates anything, following planted links);
- ``--experimental-rerun`` (which unpickles a file) is refused;
- ``hydra.job.env_set`` may not set ``DPBENCH_*``, ``XDG_CONFIG_HOME`` or ``HOME``, nor may a
  launcher value name them (the MAC key is the user's, read before Hydra composes);
- ``hydra.sweeper`` must be the basic sweeper (Hydra's, or dpbench's, which composes each job
  once: ``config.compose_once``) and ``hydra.launcher`` a known launcher.

In a sweep every job is composed, as the basic sweeper lists them (``glob(...)``, ``choice``,
``range``, group sweeps, the sweeper's ``params``; the product of all), and each is checked.

A configuration that does not compose is left to ``hydra.main`` to report.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from dpbench.config.targets import check_targets, is_allowed_target
from dpbench.errors import ConfigError

#: handler and formatter classes a logging config may name (nothing imported, nothing written)
LOGGING_CLASSES = {
    "handlers": frozenset({"logging.StreamHandler", "logging.NullHandler"}),
    "formatters": frozenset({"logging.Formatter"}),
}
#: the only ``ext://`` names a logging config may resolve
EXTERNAL_NAMES = frozenset({"ext://sys.stdout", "ext://sys.stderr"})
LOGGING_KEYS = ("hydra.job_logging", "hydra.hydra_logging")


def _walk(prefix: str, node: Any) -> Iterator[tuple[str, Any, Any]]:
    """Yield (dotted key, key, value) of every entry under ``node`` (dicts and lists)."""
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{prefix}.{key}"
            yield where, key, value
            yield from _walk(where, value)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield f"{prefix}[{i}]", i, value
            yield from _walk(f"{prefix}[{i}]", value)


def check_logging_config(node: Any, key: str) -> None:
    """Raise ConfigError naming the key of the first value of the ``logging.config`` dict
    ``node`` that would run code or write a file (see the module docstring)."""
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=True)
    if not isinstance(node, dict):
        return
    for where, name, value in _walk(key, node):
        if name == "()" and not (isinstance(value, str) and is_allowed_target(value)):
            raise ConfigError(f"{where}={value!r} is not an allowed factory: a logging config "
                              "may not call code (docs/reliability-bad-input.md)")
        if isinstance(value, str) and value.startswith("ext://") and value not in EXTERNAL_NAMES:
            raise ConfigError(f"{where}={value!r} is refused: a logging config may name only "
                              f"{' or '.join(sorted(EXTERNAL_NAMES))}")
    for section, allowed in LOGGING_CLASSES.items():
        for name, entry in (node.get(section) or {}).items():
            if isinstance(entry, dict) and "class" in entry and entry["class"] not in allowed:
                raise ConfigError(
                    f"{key}.{section}.{name}.class={entry['class']!r} is refused: a logging "
                    f"config may use {', '.join(sorted(allowed))} (dpbench writes run.log "
                    "itself; docs/reliability-bad-input.md)")


def _resolved(cfg: DictConfig, key: str) -> Any:
    """Return the node ``key`` of ``cfg`` as plain containers, interpolations resolved."""
    node = OmegaConf.select(cfg, key)
    if not isinstance(node, DictConfig):
        return node
    try:
        return OmegaConf.to_container(node, resolve=True)
    except Exception:  # noqa: BLE001 - e.g. ${hydra.runtime.output_dir}, known only later
        # checked as written: an interpolation where a factory, class or ext:// name is
        # expected is then not an allowed name, so it is refused
        return OmegaConf.to_container(node, resolve=False)


def check_hydra_node(cfg: DictConfig) -> None:
    """Raise ConfigError for a callback or logging value of ``cfg.hydra`` that is refused."""
    check_targets(_resolved(cfg, "hydra.callbacks"), "hydra.callbacks")
    check_plugins(cfg)
    check_environment(cfg)
    subdir = OmegaConf.select(cfg, "hydra.output_subdir")
    if subdir is not None:  # Hydra writes there with open(): before validation, through links
        raise ConfigError(f"hydra.output_subdir={subdir!r} is refused: dpbench writes the run's "
                          "config.yaml itself once its settings are valid (keep it null)")
    for key in LOGGING_KEYS:
        check_logging_config(_resolved(cfg, key), key)


#: the sweepers whose jobs the guard can list (what it composes is what they run): Hydra's
#: basic sweeper and dpbench's, the basic sweeper composing each job once
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
SWEEPERS = frozenset({BASIC_SWEEPER,
                      "hydra_plugins.dpbench_sweeper.compose_once_sweeper.ComposeOnceSweeper"})
#: launchers Hydra may instantiate (``hydra.launcher._target_``)
LAUNCHERS = frozenset({
    "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
})
#: most jobs one sweep may compose (each is composed once here, as Hydra itself does)
MAX_SWEEP_JOBS = 100_000


def _names_key_variable(text: str) -> bool:
    """Whether a launcher string names a variable that chooses the MAC key."""
    return any(name in text for name in ("DPBENCH_MAC_KEY", "XDG_CONFIG_HOME", "HOME="))


def check_environment(cfg: DictConfig) -> None:
    """Raise ConfigError if ``cfg`` could set the MAC key's variables for a job: a
    ``hydra.job.env_set`` of ``DPBENCH_*``, ``XDG_CONFIG_HOME`` or ``HOME``, or a launcher
    value (a submitit ``setup`` line, ``srun_args``) naming one. The key is the user's: it is
    read from the environment dpbench started in, never from a config file."""
    env_set = OmegaConf.select(cfg, "hydra.job.env_set")
    for name in (env_set.keys() if isinstance(env_set, DictConfig) else []):
        if str(name).startswith("DPBENCH_") or name in ("XDG_CONFIG_HOME", "HOME"):
            raise ConfigError(f"hydra.job.env_set.{name} is refused: dpbench's environment "
                              "(the MAC key above all) is the user's, set in the shell, never "
                              "by a config (docs/reliability-bad-input.md)")
    launcher = _resolved(cfg, "hydra.launcher")
    for where, _, value in _walk("hydra.launcher", launcher if isinstance(launcher, dict)
                                 else {}):
        if isinstance(value, str) and _names_key_variable(value):
            raise ConfigError(f"{where}={value!r} is refused: it names a variable that "
                              "chooses the MAC key (DPBENCH_MAC_KEY*, XDG_CONFIG_HOME, HOME), "
                              "which only the user's shell sets (docs/reliability-bad-input.md)")


def check_plugins(cfg: DictConfig) -> None:
    """Raise ConfigError unless ``hydra.sweeper`` and ``hydra.launcher`` name known plugins
    (Hydra imports the class a ``_target_`` names before checking its type)."""
    for key, allowed in (("hydra.sweeper", SWEEPERS), ("hydra.launcher", LAUNCHERS)):
        target = OmegaConf.select(cfg, f"{key}._target_")
        if target is not None and target not in allowed:
            raise ConfigError(f"{key}._target_={target!r} is refused: dpbench runs with "
                              f"{', '.join(sorted(allowed))}")


def _sweep_jobs(hydra: Any, overrides: list[str]) -> list[list[str]]:
    """Return the override list of every job the basic sweeper runs for ``overrides`` (its
    own ``params`` first): Hydra's parser with the config loader (so ``glob(...)`` lists the
    group's options) and the sweeper's own ``split_arguments`` (the product of every sweep,
    group sweeps included). A sweep it cannot list is refused: the guard checks only what it
    has composed."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create(config_loader=hydra.config_loader)
    try:
        parsed = parser.parse_overrides(overrides)
        count = 1
        for override in parsed:
            if override.is_sweep_override() and override.is_discrete_sweep():
                count *= max(1, len(list(override.sweep_string_iterator())))
        if count > MAX_SWEEP_JOBS:
            raise ConfigError(f"the sweep has {count} jobs, more than the {MAX_SWEEP_JOBS} "
                              "allowed in one command")
        batches = BasicSweeper.split_arguments(parsed, None)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - e.g. interval(): the basic sweeper refuses it
        raise ConfigError(f"the sweep cannot be listed ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''}); dpbench checks "
                          "every job before Hydra runs any") from None
    return [job for batch in batches for job in batch]


#: the parts of the ``hydra`` node that ``check_hydra_node`` checks
CHECKED_KEYS = ("hydra.callbacks", *LOGGING_KEYS, "hydra.launcher", "hydra.sweeper",
                "hydra.job.env_set", "hydra.output_subdir")


def _same_hydra_node(hydra: Any, jobs: list[list[str]]) -> list[list[list[str]]]:
    """Group ``jobs`` by what can change their checked ``hydra`` values: the config group
    choices (the defaults list) and the overrides of ``hydra`` keys. Jobs of one group
    differ only in plain values outside ``hydra``, which reach the checked values only
    through an interpolation; so one composition per group is checked, or every one where
    the checked values interpolate (``_interpolates``). A sweep of seeds x settings is then
    composed once per group choice, not once per job."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    repository = hydra.config_loader.repository
    groups: dict[tuple[str, ...], list[list[str]]] = {}
    for job in jobs:
        key = []
        for override in parser.parse_overrides(job):
            name = override.key_or_group
            if (name == "hydra" or override.is_hydra_override()
                    or repository.group_exists(name)):
                key.append(override.input_line)
        groups.setdefault(tuple(key), []).append(job)
    return list(groups.values())


def _interpolates(cfg: DictConfig) -> bool:
    """Return whether a value ``check_hydra_node`` checks holds an interpolation."""
    for key in CHECKED_KEYS:
        node = OmegaConf.select(cfg, key)
        if isinstance(node, DictConfig | ListConfig):
            node = OmegaConf.to_container(node, resolve=False)
        if isinstance(node, str) and "${" in node:
            return True
        if any(isinstance(v, str) and "${" in v for _, _, v in _walk(key, node)):
            return True
    return False


def check_hydra_command(argv: Sequence[str], config_dir: str, config_name: str,
                        calling_module: str) -> None:
    """Compose what ``hydra.main(config_path=config_dir, config_name=...)`` will run for the
    command line ``argv`` (without the program name) and raise ConfigError for a refused
    callback, logging factory or handler (module docstring). Composition errors are left to
    ``hydra.main``."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_automatic_config_search_path, get_args_parser
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    try:
        args = get_args_parser().parse_args(list(argv))
    except SystemExit:
        return  # hydra.main prints the usage error itself
    if getattr(args, "experimental_rerun", None) is not None:
        raise ConfigError("--experimental-rerun is refused: it unpickles a file, which can run "
                          "code; run again with the overrides instead")
    config_name = args.config_name or config_name
    search_path = create_automatic_config_search_path(None, calling_module,
                                                      args.config_path or config_dir)
    if args.config_dir is not None:
        import os

        search_path.prepend(provider="command-line",
                            path=f"file://{os.path.abspath(args.config_dir)}",
                            anchor=SearchPathQuery(provider="schema"))
    try:
        hydra = Hydra.create_main_hydra2(task_name="dpbench-check",
                                         config_search_path=search_path)
    except Exception:  # noqa: BLE001 - hydra.main reports a bad search path
        return
    try:
        overrides = list(args.overrides)
        try:  # one composition gives the run mode too (as Hydra's get_mode composes); a
            # single run's hydra node equals it, a sweep's master config is it
            cfg = hydra.compose_config(config_name, overrides, run_mode=RunMode.MULTIRUN,
                                       validate_sweep_overrides=False)
        except Exception:  # noqa: BLE001 - composition errors: hydra.main reports them
            return
        check_hydra_node(cfg)
        multirun = bool(args.multirun) or OmegaConf.select(cfg, "hydra.mode") == RunMode.MULTIRUN
        if not multirun:
            return
        params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
        swept = [f"{k}={v}" for k, v in params.items()] + overrides
        for members in _same_hydra_node(hydra, _sweep_jobs(hydra, swept)):
            for job in members:
                try:
                    job_cfg = hydra.compose_config(config_name, job, run_mode=RunMode.RUN)
                except Exception:  # noqa: BLE001 - the launcher reports a job that won't compose
                    continue
                check_hydra_node(job_cfg)
                if not _interpolates(job_cfg):
                    break  # the class's other jobs compose this very node (``_same_hydra_node``)
    finally:
        GlobalHydra.instance().clear()
