"""Stored tuning choices (``choices.json``) and how a later run applies them (``tuned=FILE``).

A choice is keyed by its cell (method, data set, model, target epsilon, and the method
settings that differ from the method's defaults: an ablation's variant) and holds the
overrides the search chose, the search's mode and, in ``accounted`` mode, the search's
privacy ledger and selection epsilon, so that every run using the choice can report the
total epsilon of search + run (docs/tuning-and-claims.md, "Tuning").
"""

from __future__ import annotations

import fcntl
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from dpbench.errors import ConfigError
from dpbench.utils.io import atomic_write_json

CHOICES_NAME = "choices.json"
MODES = ("accounted", "unaccounted")


def cell_key(method: str, dataset: str, model: str, target_epsilon: Any,
             variant: dict[str, Any] | None = None) -> str:
    """Return the key of a (method, data set, model, epsilon) cell; ``variant`` (method
    settings that differ from the method's defaults, e.g. an ablation's ``correction``) is
    part of the key, so each variant of a method is tuned on its own."""
    eps = "nonprivate" if target_epsilon is None else f"{float(target_epsilon):g}"
    key = f"{method}|{dataset}|{model}|eps={eps}"
    if variant:
        key += "|" + ",".join(f"{name}={variant[name]}" for name in sorted(variant))
    return key


def variant_settings(cfg: DictConfig) -> dict[str, Any]:
    """Return the ``method.settings`` of ``cfg`` that differ from the method's defaults (its
    settings dataclass): the settings that define a variant, empty for the default one."""
    from dpbench.methods import METHODS

    settings = cfg.method.get("settings")
    settings = OmegaConf.to_container(settings, resolve=True) if settings else {}
    defaults = OmegaConf.to_container(OmegaConf.structured(
        METHODS.get(cfg.method.name).settings_cls))
    return {name: value for name, value in settings.items()
            if name not in defaults or defaults[name] != value}


def cfg_cell_key(cfg: DictConfig) -> str:
    return cell_key(cfg.method.name, cfg.dataset.name, cfg.model.name,
                    cfg.privacy.get("target_epsilon"), variant_settings(cfg))


def read_choices(path: str | Path) -> dict[str, Any]:
    """Return the choices file's cells by key; ConfigError (naming ``tuned``) if unusable."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as err:
        raise ConfigError(f"tuned: no choices file at {path}") from err
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"tuned: cannot read {path} ({type(err).__name__}: {err})") from err
    cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(cells, dict):
        raise ConfigError(f"tuned: {path} is not a dpbench-tune choices file (no 'cells')")
    return cells


@contextmanager
def _locked(path: Path):
    """Hold an exclusive lock beside ``path`` (parallel searches write one choices file); POSIX
    ``flock``, as ``dpbench.utils.lock`` uses for run folders."""
    with open(path.with_name(path.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_choice(path: str | Path, key: str, choice: dict[str, Any]) -> None:
    """Add or replace one cell's choice in the choices file (atomically, under a lock, so
    that cells searched in parallel processes never drop each other's choices)."""
    path = Path(path)
    with _locked(path):
        cells = read_choices(path) if path.exists() else {}
        cells[key] = choice
        atomic_write_json(path, {"cells": dict(sorted(cells.items()))})


def apply_tuned(cfg: DictConfig) -> DictConfig:
    """Return ``cfg`` with the stored choice of its cell applied (``tuned=FILE``), else as is.

    Sets each chosen override (e.g. ``method.optimizer.lr``) and ``tuning`` (mode, chosen
    values, the search's ledger and selection epsilon) so the run's record carries them.
    """
    source = cfg.get("tuned")
    if not source:
        return cfg
    cells = read_choices(source)
    key = cfg_cell_key(cfg)
    if key not in cells:
        raise ConfigError(f"tuned: {source} has no choice for the cell {key} (it has: "
                          f"{', '.join(sorted(cells)) or 'none'})")
    choice = cells[key]
    cfg = cfg.copy()
    with open_dict(cfg):
        for name, value in choice["overrides"].items():
            OmegaConf.update(cfg, name, value, merge=False)
        cfg.tuning = {"mode": choice["mode"], "source": str(source), "chosen": choice[
            "overrides"], "search_ledger": choice.get("search_ledger") or [],
            "selection_epsilon": choice.get("selection_epsilon"),
            "at_grid_edge": bool(choice.get("at_grid_edge", False)),
            "search_epsilon": choice.get("search_epsilon")}
    return cfg
