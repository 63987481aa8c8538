"""Stored tuning choices (``choices.json``) and how a later run applies them (``tuned=FILE``).

A choice is keyed by its cell (method, data set, model, target epsilon, the method settings
that define a variant, the batch sampler and neighbouring relation unless Poisson under
add/remove, and a hash of every other setting that changes a run, ``cfg_cell_key``)
and holds the overrides the search chose, the search's mode and, in ``accounted`` mode, every
trial with its own privacy ledger and the selection epsilon, so that every run using the
choice can report the total epsilon of search + run (docs/tuning-and-claims.md, "Tuning").

A choices file is data from whoever wrote the folder, never code or privacy settings
(docs/reliability-bad-input.md, "Files from others"): it is read bounded (``read_bytes``), must
be of this version, and a cell may set only the keys in ``TUNABLE``, each type- and
range-checked. Its ledgers are not trusted as written: the search's ledger is rebuilt from the
trials' own ledgers, every completed trial's epsilon and steps are re-derived from its ledger
and checked against the plan of the cell (its target or noise multiplier), the selection
epsilon has a floor (the cell's target when the file is not authenticated by this user's MAC
key), and the totals are recomputed; a file that disagrees is refused, naming the file, the
cell and the key.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from dpbench.errors import ConfigError
from dpbench.privacy.samplers import with_settled_accountant
from dpbench.utils.conf import without_added_defaults
from dpbench.utils.io import json_bytes
from dpbench.utils.mac import is_authentic, write_authenticated
from dpbench.utils.safe_json import UnsafeFile, parse_json, read_bytes

CHOICES_NAME = "choices.json"
MODES = ("accounted", "unaccounted")
#: format of choices.json; a file of another version is refused (tune again into a new --out)
CHOICES_VERSION = 2
#: choices files are small; anything larger is refused unread
MAX_CHOICES_BYTES = 16 * 2**20
#: bounds on what a later run recomputes from a choice (a search has a few trials, each
#: with a ledger of a few entries)
MAX_TRIALS = 1000
MAX_LEDGER_ENTRIES = 1000
#: steps of one ledger entry: far beyond any run (the accountant overflows near 1e9)
MAX_LEDGER_STEPS = 10**8
#: the smallest selection epsilon a search uses or a file may state (``--selection-epsilon``)
SELECTION_EPSILON_MIN = 0.01


def positive_finite_problem(value: Any) -> str | None:
    """Return why ``value`` is not a finite number > 0, or None if it is."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number (got {value!r})"
    if not math.isfinite(value) or value <= 0:
        return f"must be a finite number > 0 (got {value!r})"
    return None


def batch_size_problem(value: Any) -> str | None:
    """Return why ``value`` is not a batch size (an integer >= 1), or None if it is."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**31:
        return f"must be an integer >= 1 (got {value!r})"
    return None


def clip_floor_problem(value: Any) -> str | None:
    """Return why ``value`` is not a clip floor (a finite number >= 0), or None if it is."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value >= 0):
        return f"must be a finite number >= 0 (got {value!r})"
    return None


#: the only keys a choices file may set, each with its check (an error text, or None): the
#: learning rate (both strategies), the batch size and the clip floor (the random strategy)
TUNABLE: dict[str, Callable[[Any], str | None]] = {
    "method.optimizer.lr": positive_finite_problem,
    "trainer.batch_size": batch_size_problem,
    "method.settings.clip_floor": clip_floor_problem,
}
#: tuned keys left out of a cell's key. Only the learning rate, as when it was the one tunable
#: key, so earlier choices files still match; a batch size or clip floor searched by the
#: random strategy stays in the key at the cell's own value, which the choice then overrides
_TUNED_NOT_IN_KEY = ("method.optimizer.lr",)

#: top-level keys that do not change what a run computes, or are set per run (seed, split)
_NOT_IN_KEY = ("logger", "paths", "hydra", "run_name", "seed", "tuned", "tuning", "evaluation")
_NOT_IN_KEY_TRAINER = ("resume", "progress", "eval_batch_size", "num_threads", "checkpoint",
                       "device")
_NOT_IN_KEY_DATASET = ("root",)  # where a standard data set lives on this machine


def cell_key(method: str, dataset: str, model: str, target_epsilon: Any,
             variant: dict[str, Any] | None = None) -> str:
    """Return the readable part of a cell's key: (method, data set, model, epsilon) and the
    ``variant`` (method settings that differ from the method's defaults, e.g. an ablation's
    ``correction``), so each variant of a method is tuned on its own and says so."""
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


def run_settings(cfg: DictConfig) -> dict[str, Any]:
    """Return every setting of ``cfg`` that changes what a run computes, except the learning
    rate, the seed and the evaluation split (trials and final runs of a cell differ there)."""
    data = {key: OmegaConf.to_container(cfg[key], resolve=True)
            if isinstance(cfg[key], DictConfig) else cfg[key]
            for key in cfg if key not in _NOT_IN_KEY}
    for group, dropped in (("trainer", _NOT_IN_KEY_TRAINER), ("dataset", _NOT_IN_KEY_DATASET)):
        if isinstance(data.get(group), dict):
            data[group] = {k: v for k, v in data[group].items() if k not in dropped}
    for dotted in _TUNED_NOT_IN_KEY:
        *parents, leaf = dotted.split(".")
        node: Any = data
        for name in parents:
            node = node.get(name) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return with_settled_accountant(without_added_defaults(data))


def cfg_cell_key(cfg: DictConfig) -> str:
    """Return the key of ``cfg``'s cell: readable (method, data set, model, epsilon), then a
    hash of every other setting that changes a run (``run_settings``), so that cells that
    differ anywhere else (``trainer.epochs=1,3``, a method setting) never share a choice.

    The one place a cell's key is defined: searches, stored choices and ``tuned=FILE`` all
    call it.
    """
    settings = json.dumps(run_settings(cfg), sort_keys=True, default=str)
    digest = hashlib.sha256(settings.encode()).hexdigest()[:12]
    base = cell_key(cfg.method.name, cfg.dataset.name, cfg.model.name,
                    cfg.privacy.get("target_epsilon"), variant_settings(cfg))
    return f"{base}{sampler_key(cfg)}|run={digest}"


def sampler_key(cfg: DictConfig) -> str:
    """Return the readable sampler part of a cell's key: ``|sampler=S|neighbouring=R`` (the
    relation resolved: null is the sampler's own), empty for Poisson under add/remove so that
    earlier choices files still match. An epsilon target under another sampler or relation
    is another guarantee: its choice is tuned on its own."""
    from dpbench.privacy.samplers import ADD_REMOVE, DEFAULT_SAMPLER, resolve_sampling

    sampler = cfg.trainer.get("sampler") or DEFAULT_SAMPLER
    try:
        relation = resolve_sampling(sampler, cfg.privacy.get("neighbouring"), None, False)
    except ConfigError:
        relation = cfg.privacy.get("neighbouring")
    if sampler == DEFAULT_SAMPLER and relation == ADD_REMOVE:
        return ""
    return f"|sampler={sampler}|neighbouring={relation}"


def read_choices(path: str | Path) -> dict[str, Any]:
    """Return the choices file's cells by key (not yet checked: ``checked_choice``);
    ConfigError naming ``tuned`` and the file if it is unusable."""
    return read_choices_authenticated(path)[0]


def read_choices_authenticated(path: str | Path) -> tuple[dict[str, Any], bool]:
    """Return (the choices file's cells by key, whether its MAC verifies with this user's
    key: ``utils.mac``, written by this user's ``dpbench-tune``), read once."""
    path = Path(path)
    try:
        raw = read_bytes(path, max_bytes=MAX_CHOICES_BYTES)
        data = parse_json(raw, path)
    except FileNotFoundError as err:
        raise ConfigError(f"tuned: no choices file at {path}") from err
    except UnsafeFile as err:
        raise ConfigError(f"tuned: {err}") from err
    except OSError as err:
        raise ConfigError(f"tuned: cannot read {path} ({err.strerror or err})") from err
    cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(cells, dict):
        raise ConfigError(f"tuned: {path} is not a dpbench-tune choices file (no 'cells')")
    version = data.get("version")
    if version != CHOICES_VERSION:
        raise ConfigError(f"tuned: {path} has version={version!r}, this dpbench reads version "
                          f"{CHOICES_VERSION}; tune again into a new --out")
    return cells, is_authentic(path, raw)


@contextmanager
def _locked(path: Path):
    """Hold an exclusive lock beside ``path`` (parallel searches write one choices file); POSIX
    ``flock``, as ``dpbench.utils.lock`` uses for run folders."""
    lock = path.with_name(path.name + ".lock")
    try:  # never through a planted link
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as err:
        raise ConfigError(f"cannot lock {path}: {lock} is not a plain file "
                          f"({err.strerror or err})") from err
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def write_choice(path: str | Path, key: str, choice: dict[str, Any]) -> None:
    """Add or replace one cell's choice in the choices file (atomically, under a lock, so
    that cells searched in parallel processes never drop each other's choices)."""
    path = Path(path)
    with _locked(path):
        cells = read_choices(path) if path.exists() else {}
        cells[key] = choice
        write_authenticated(path, json_bytes({"version": CHOICES_VERSION,
                                              "cells": dict(sorted(cells.items()))}))


def _refuse(source: Any, key: str, field: str, why: str) -> ConfigError:
    return ConfigError(f"tuned: {source}: cell {key}: {field} {why}")


def _ledger_entries(source: Any, key: str, field: str, ledger: Any) -> list[dict[str, Any]]:
    """Return ``ledger`` if every entry is a well-formed (sigma, q, steps) group."""
    if not isinstance(ledger, list):
        raise _refuse(source, key, field, f"must be a list of ledger entries (got {ledger!r})")
    if len(ledger) > MAX_LEDGER_ENTRIES:  # accounting cost grows with the entries
        raise _refuse(source, key, field, f"has {len(ledger)} entries (at most "
                      f"{MAX_LEDGER_ENTRIES})")
    for i, entry in enumerate(ledger):
        where = f"{field}[{i}]"
        if not isinstance(entry, dict):
            raise _refuse(source, key, where, "must be a ledger entry (an object)")
        sigma, rate, steps = (entry.get(k) for k in ("noise_multiplier", "sample_rate", "steps"))
        if (problem := positive_finite_problem(sigma)) is not None:
            raise _refuse(source, key, f"{where}.noise_multiplier", problem)
        if positive_finite_problem(rate) is not None or rate > 1:
            raise _refuse(source, key, f"{where}.sample_rate", f"must be in (0, 1] (got {rate!r})")
        if isinstance(steps, bool) or not isinstance(steps, int) or not (
                0 <= steps <= MAX_LEDGER_STEPS):
            raise _refuse(source, key, f"{where}.steps", f"must be an integer in [0, "
                          f"{MAX_LEDGER_STEPS:g}] (got {steps!r})")
    return ledger


def cell_plan(cfg: DictConfig | None) -> dict[str, Any] | None:
    """Return what a cell's config fixes of every trial's mechanism: its target epsilon or
    fixed noise multiplier, and the bands b of cyclic Poisson sampling (None without cfg)."""
    if cfg is None:
        return None
    privacy = cfg.privacy
    fixed = privacy.get("noise_multiplier")
    bands = OmegaConf.select(cfg, "method.settings.bands", default=None)
    return {"private": bool(privacy.get("enabled", True)),
            "target": None if fixed is not None else privacy.get("target_epsilon"),
            "noise_multiplier": fixed,
            "bands": bands if isinstance(bands, int) and bands >= 1 else 1}


def _check_trial(source: Any, key: str, i: int, trial: dict[str, Any],
                 ledger: list[dict[str, Any]], delta: float, accountant: str,
                 plan: dict[str, Any] | None) -> None:
    """Refuse a trial whose ledger is not the mechanism of the setting it names.

    A completed trial (it has a score) states its epsilon and its steps: its ledger must give
    that epsilon and hold ceil(steps / b) accounted steps; under a cell calibrated to a target
    it spends the target (less the calibration's tolerance), under a fixed noise multiplier
    every entry has it. A failed trial's ledger is counted as a whole run
    (``_failed_as_full``).
    """
    from dpbench.privacy.calibration import RELATIVE_TOLERANCE
    from dpbench.privacy.composition import compose_ledgers
    from dpbench.privacy.record_check import accounted_steps

    field = f"trials[{i}]"
    own = compose_ledgers([ledger], delta, accountant)
    claimed = trial.get("epsilon")
    if claimed is not None:
        if (problem := positive_finite_problem(claimed)) is not None:
            raise _refuse(source, key, f"{field}.epsilon", problem)
        if not math.isclose(own, claimed, rel_tol=1e-6):
            raise _refuse(source, key, f"{field}.ledger",
                          f"gives epsilon {own:.4g}, not the trial's own epsilon "
                          f"{claimed:.4g}: the ledger was edited")
    if "failed" in trial or trial.get("score") is None or plan is None or not plan["private"]:
        return
    if claimed is None:
        raise _refuse(source, key, f"{field}.epsilon", "is missing for a completed trial: its "
                      "epsilon is re-derived from its ledger and must be stated")
    steps = trial.get("steps")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise _refuse(source, key, f"{field}.steps", f"must be an integer >= 1 for a "
                      f"completed trial (got {steps!r})")
    held = sum(e["steps"] for e in ledger)
    if held != accounted_steps(steps, plan["bands"]):
        raise _refuse(source, key, f"{field}.ledger", f"holds {held} accounted steps, but the "
                      f"trial ran {steps} steps")
    target, sigma = plan["target"], plan["noise_multiplier"]
    if target is not None and own < float(target) * (1 - 2 * RELATIVE_TOLERANCE):
        raise _refuse(source, key, f"{field}.ledger", f"gives epsilon {own:.4g}, below the "
                      f"cell's target {float(target):g} that every trial is calibrated to")
    if sigma is not None and any(not math.isclose(e["noise_multiplier"], float(sigma),
                                                  rel_tol=1e-9) for e in ledger):
        raise _refuse(source, key, f"{field}.ledger", f"has a noise multiplier other than "
                      f"the cell's privacy.noise_multiplier={float(sigma):g}")


def _trials_totals(source: Any, key: str, choice: dict[str, Any],
                   plan: dict[str, Any] | None = None) -> tuple[list, float]:
    """Return the search's ledger and the composed epsilon of all its trials, recomputed from
    the trials' own ledgers, each checked against the cell's plan (``_check_trial``); a
    stored ``search_ledger`` or ``trials_epsilon`` must agree."""
    from dpbench.privacy.accountant import check_accountant
    from dpbench.privacy.composition import compose_ledgers

    delta, accountant = choice.get("delta"), choice.get("accountant")
    if positive_finite_problem(delta) is not None or delta >= 1:
        raise _refuse(source, key, "delta", f"must be in (0, 1) (got {delta!r})")
    try:
        check_accountant(accountant)
    except (ConfigError, TypeError) as err:
        raise _refuse(source, key, "accountant", f"is not an accountant ({err})") from err
    trials = choice.get("trials")
    if not isinstance(trials, list) or not trials:
        raise _refuse(source, key, "trials", "must list the search's trials")
    if len(trials) > MAX_TRIALS:
        raise _refuse(source, key, "trials", f"has {len(trials)} entries (at most {MAX_TRIALS})")
    ledgers = []
    for i, trial in enumerate(trials):
        if not isinstance(trial, dict):
            raise _refuse(source, key, f"trials[{i}]", "must be an object")
        ledger = _ledger_entries(source, key, f"trials[{i}].ledger", trial.get("ledger"))
        _check_trial(source, key, i, trial, ledger, delta, accountant, plan)
        ledgers.append(ledger)
    search_ledger = [entry for ledger in ledgers for entry in ledger]
    if "search_ledger" in choice and choice["search_ledger"] != search_ledger:
        raise _refuse(source, key, "search_ledger", "differs from the trials' own ledgers")
    _check_stored(source, key, choice, "trials_epsilon",
                  compose_ledgers([search_ledger], delta, accountant))
    if plan is not None:  # a failed trial's steps cannot be re-derived: counted as run out
        ledgers = _failed_as_full(trials, ledgers, delta, accountant)
        search_ledger = [entry for ledger in ledgers for entry in ledger]
    return search_ledger, compose_ledgers([search_ledger], delta, accountant)


def _failed_as_full(trials: list[dict[str, Any]], ledgers: list[list[dict[str, Any]]],
                    delta: float, accountant: str) -> list[list[dict[str, Any]]]:
    """Return the ledgers with each failed trial's replaced by a completed trial's whole one
    (of the same batch size if there is one, else the one spending most) when that spends
    more: how far a failed trial ran is only its own word, and every trial of a cell is
    planned to spend the same target."""
    from dpbench.privacy.composition import compose_ledgers

    def spent(ledger: list[dict[str, Any]]) -> float:
        return compose_ledgers([ledger], delta, accountant)

    def batch(trial: dict[str, Any]) -> Any:
        overrides = trial.get("overrides")
        return overrides.get("trainer.batch_size") if isinstance(overrides, dict) else None

    done = [(t, ledger) for t, ledger in zip(trials, ledgers)
            if "failed" not in t and t.get("score") is not None]
    out = []
    for trial, ledger in zip(trials, ledgers):
        if "failed" in trial or trial.get("score") is None:
            same = [full for t, full in done if batch(t) == batch(trial)] or [
                full for _, full in done]
            full = max(same, key=spent, default=ledger)
            ledger = full if spent(full) > spent(ledger) else ledger
        out.append(ledger)
    return out


def _check_stored(source: Any, key: str, choice: dict[str, Any], field: str,
                  value: float) -> None:
    """Refuse a stored ``field`` that differs from ``value``, recomputed from the trials."""
    stored = choice.get(field)
    if stored is not None and not (isinstance(stored, (int, float)) and math.isclose(
            stored, value, rel_tol=1e-6, abs_tol=1e-9)):
        raise _refuse(source, key, field, f"is {stored!r} but the trials' ledgers give "
                      f"{value:.6g}")


def _selection_epsilon(source: Any, key: str, choice: dict[str, Any],
                       plan: dict[str, Any] | None, authentic: bool) -> float:
    """Return the selection's epsilon to account: the stored one, at least
    ``SELECTION_EPSILON_MIN``; from a file this user's key does not authenticate, at least
    the documented default (the cell's target epsilon), and refused for a cell without one."""
    eps_sel = choice.get("selection_epsilon")
    if (problem := positive_finite_problem(eps_sel)) is not None:
        raise _refuse(source, key, "selection_epsilon", problem)
    if eps_sel < SELECTION_EPSILON_MIN:
        raise _refuse(source, key, "selection_epsilon", f"is {eps_sel!r}, below the smallest "
                      f"a search uses ({SELECTION_EPSILON_MIN:g})")
    if authentic or plan is None:
        return float(eps_sel)
    target = plan["target"]
    if target is None:
        raise _refuse(source, key, "selection_epsilon", "cannot be checked: the file is not "
                      "authenticated by your MAC key and the cell has no target epsilon to "
                      "default to; tune the cell yourself")
    return max(float(eps_sel), float(target))


def _accounted_totals(source: Any, key: str, choice: dict[str, Any],
                      plan: dict[str, Any] | None = None, authentic: bool = True
                      ) -> dict[str, Any]:
    """Return the accounted search's ledger and epsilons, recomputed from its trials."""
    eps_sel = _selection_epsilon(source, key, choice, plan, authentic)
    search_ledger, trials_epsilon = _trials_totals(source, key, choice, plan)
    if eps_sel == choice["selection_epsilon"]:  # a floored one differs from the stored total
        _check_stored(source, key, choice, "search_epsilon", max(trials_epsilon, eps_sel))
    return {"search_ledger": search_ledger, "selection_epsilon": eps_sel,
            "search_epsilon": max(trials_epsilon, eps_sel)}


def checked_choice(source: Any, key: str, choice: Any, cfg: DictConfig | None = None,
                   authentic: bool = True) -> dict[str, Any]:
    """Return the checked, recomputed content of one stored choice; ConfigError if it is
    malformed, sets a key outside ``TUNABLE``, or its ledgers disagree with its trials or
    with the plan of the cell ``cfg`` (when given). ``authentic``: whether this user's MAC
    key authenticates the file (``_selection_epsilon``)."""
    if not isinstance(choice, dict):
        raise _refuse(source, key, "the cell", "must be an object")
    if choice.get("key") != key:
        raise _refuse(source, key, "key", f"is {choice.get('key')!r}: the choice was made for "
                      "another cell")
    mode = choice.get("mode")
    if mode not in MODES:
        raise _refuse(source, key, "mode", f"must be one of {', '.join(MODES)} (got {mode!r})")
    overrides = choice.get("overrides")
    if not isinstance(overrides, dict) or not overrides:
        raise _refuse(source, key, "overrides", "must map tuned keys to values")
    for name, value in overrides.items():
        if name not in TUNABLE:
            raise _refuse(source, key, f"overrides.{name}",
                          f"is not a tunable key: a choices file may set only "
                          f"{', '.join(sorted(TUNABLE))}")
        problem = TUNABLE[name](value)
        if problem:
            raise _refuse(source, key, f"overrides.{name}", problem)
    edge = choice.get("at_grid_edge", False)
    out = {"mode": mode, "chosen": dict(overrides), "at_grid_edge": edge is True,
           "search_ledger": [], "selection_epsilon": None, "search_epsilon": None}
    plan = cell_plan(cfg)
    if mode == "accounted":
        out.update(_accounted_totals(source, key, choice, plan, authentic))
    else:
        switched = [k for k in ("selection_epsilon", "search_epsilon") if k in choice]
        if switched:  # an accounted search's choice relabelled: its selection read the data
            raise _refuse(source, key, "mode", f"is unaccounted, but the choice holds an "
                          f"accounted search's {switched[0]}: it was switched")
        if "trials_epsilon" in choice or "search_ledger" in choice:
            _trials_totals(source, key, choice, plan)  # an unaccounted search's, checked too
    return out


def choice_mode(source: Any, cells: dict[str, Any], key: str,
                cfg: DictConfig | None = None) -> str | None:
    """Return the mode of the stored (checked) choice of ``key``, or None if there is none."""
    if key not in cells:
        return None
    return checked_choice(source, key, cells[key], cfg)["mode"]


def apply_tuned(cfg: DictConfig) -> DictConfig:
    """Return ``cfg`` with the stored choice of its cell applied (``tuned=FILE``), else as is.

    Sets each chosen override (only ``TUNABLE`` keys) and ``tuning`` (mode, chosen values, the
    search's ledger rebuilt from its trials and the selection epsilon) so the run's record
    carries them.
    """
    source = cfg.get("tuned")
    if not source:
        return cfg
    cells, authentic = read_choices_authenticated(source)
    key = cfg_cell_key(cfg)
    if key not in cells:
        raise ConfigError(f"tuned: {source} has no choice for the cell {key} (it has: "
                          f"{', '.join(sorted(cells)) or 'none'}); the key covers every "
                          "setting that changes a run")
    choice = checked_choice(source, key, cells[key], cfg, authentic)
    absent = object()
    for name in choice["chosen"]:
        if OmegaConf.select(cfg, name, default=absent) is absent:  # e.g. a method's clip floor
            raise _refuse(source, key, f"overrides.{name}", "is not a setting of this cell")
    cfg = cfg.copy()
    with open_dict(cfg):
        for name, value in choice["chosen"].items():
            OmegaConf.update(cfg, name, value, merge=False)
        cfg.tuning = {"mode": choice["mode"], "source": str(source), **choice}
    return cfg
