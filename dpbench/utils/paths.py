"""Config values that become folder names: sanitised, and refused if they would escape.

A run directory is built from config values (``conf/config.yaml``: ``hydra.run.dir`` joins
``run_name``, itself made of the groups' ``name`` keys, and Hydra's ``override_dirname``). A
value such as ``privacy.name=../../x`` must never become a path outside the output root:
the ``path_component`` resolver turns any value into one safe folder name (so Hydra never
creates a folder elsewhere), and ``check_path_values`` refuses such values before training
with one line naming the key.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dpbench.errors import ConfigError

RESOLVER = "path_component"
_UNSAFE = re.compile(r"[/\\\x00-\x1f]")


def path_component(value: Any) -> str:
    """Return ``value`` as one folder name: separators and control characters become ``_``,
    and a name made only of dots (``.``, ``..``) becomes underscores."""
    text = _UNSAFE.sub("_", str(value))
    for sep in (os.sep, os.altsep):
        if sep:
            text = text.replace(sep, "_")
    if text and text.strip(".") == "":  # "." or ".." would name a parent; "" adds no level
        text = "_" * len(text)
    return text


def is_safe_component(value: Any) -> bool:
    """Return whether ``value`` is already a safe folder name (sanitising leaves it alone)."""
    return path_component(value) == str(value)


def register_path_resolver() -> None:
    """Register ``${path_component:...}`` for the run-directory templates (idempotent)."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, path_component)


def check_inside(path: str | os.PathLike, root: str | os.PathLike, key: str) -> Path:
    """Return ``path`` resolved; raise ConfigError naming ``key`` if it lies outside ``root``."""
    resolved, base = Path(path).resolve(), Path(root).resolve()
    if resolved != base and base not in resolved.parents:
        raise ConfigError(f"{key} resolves to {resolved}, outside {base}; folder names may not "
                          "contain '/', '\\' or '..'")
    return resolved


def check_path_values(cfg: DictConfig) -> None:
    """Raise ConfigError naming the first key whose value is not a safe folder name.

    Checks every config group's ``name``, then ``run_name`` (they make up the run directory).
    """
    keys = [f"{group}.name" for group in cfg
            if isinstance(cfg.get(group), DictConfig) and "name" in cfg[group]] + ["run_name"]
    for key in keys:
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None and not is_safe_component(value):
            raise ConfigError(f"{key}={value!r} cannot be part of a folder name: it may not "
                              "contain '/', '\\', control characters or be only dots")


def check_run_dir(run_dir: str | os.PathLike, hydra_overrides: list[str],
                  root: str | os.PathLike = "outputs") -> None:
    """Raise ConfigError if a run dir built from the templates lies outside ``root``.

    A folder the user chose on the command line (``hydra.run.dir=...``, ``hydra.sweep.dir``)
    is theirs to choose and is not checked.
    """
    if any(o.lstrip("+~").startswith(("hydra.run.", "hydra.sweep.")) for o in hydra_overrides):
        return
    check_inside(run_dir, root, "hydra.run.dir")
