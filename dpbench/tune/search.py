"""The tuning protocol: per cell, search the learning rate on a validation split, then train
the choice on every seed and evaluate on the test split (docs/tuning-and-claims.md, "Tuning").

- Trials train on the training set minus a fixed validation split (``evaluation.split=
  validation``) and are scored on that validation split; the test split is never read.
- ``unaccounted``: the best validation score wins (what papers usually do); the search's
  privacy cost is not counted, and every table says so.
- ``accounted``: the choice is made by the exponential mechanism on validation accuracy
  (McSherry and Talwar 2007; utility sensitivity 1/n_val, so P(i) ~ exp(eps_sel * acc_i *
  n_val / 2)), and every run that uses the choice reports the total epsilon of all trials,
  the selection and itself (``choices.total_epsilon``).
Every trial gets its own run seed and the selection its own random stream, all spawned from
one master seed (``numpy.random.SeedSequence``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from omegaconf import DictConfig

from dpbench.errors import ConfigError, DPBenchError
from dpbench.privacy.composition import compose_ledgers
from dpbench.privacy.selection import exponential_mechanism
from dpbench.tune.choices import cfg_cell_key, positive_finite_problem

log = logging.getLogger(__name__)

#: streams spawned from the master seed, in this order (never reorder: seeds would change)
_STREAMS = ("trials", "selection")


@dataclass
class TuneSettings:
    """What to search and how (``dpbench-tune`` options)."""

    lrs: Sequence[float]
    mode: str = "unaccounted"
    select: str = "accuracy"
    validation_fraction: float = 0.15
    selection_epsilon: float | None = None  # accounted mode; None: the cell's target
    master_seed: int = 0
    extra: list[str] = field(default_factory=list)  # overrides for every trial


def spawn_seeds(master_seed: int, n_trials: int) -> tuple[list[int], np.random.Generator]:
    """Return one run seed per trial and the selection's generator, all independent."""
    trials_ss, selection_ss = np.random.SeedSequence(master_seed).spawn(len(_STREAMS))
    seeds = [int(s.generate_state(1, dtype=np.uint32)[0]) for s in trials_ss.spawn(n_trials)]
    return seeds, np.random.default_rng(selection_ss)


def search_cell(cell: list[str], settings: TuneSettings,
                run: Callable[[list[str]], tuple[DictConfig, dict[str, Any]]]) -> dict[str, Any]:
    """Run the trials of one cell and return its choice (see the module docstring).

    ``run(overrides)`` trains one configuration and returns (config, summary); failed trials
    raise, and their ledger (``err.ledger``) is still composed into the search.
    """
    check_settings(settings)
    seeds, selection_rng = spawn_seeds(settings.master_seed, len(settings.lrs))
    trials, cfg = [], None
    for lr, seed in zip(settings.lrs, seeds):
        overrides = [*cell, *settings.extra, f"method.optimizer.lr={lr}",
                     "evaluation.split=validation",
                     f"evaluation.validation_fraction={settings.validation_fraction}",
                     f"seed={seed}"]
        try:
            cfg, summary = run(overrides)
            if settings.select not in summary["metrics"]:  # stop before the other trials
                raise MissingMetric(f"--select {settings.select}: the trials report "
                                    f"{', '.join(sorted(summary['metrics'])) or 'no metric'}")
            score = summary["metrics"].get(settings.select)
            trials.append({"lr": lr, "seed": seed, "score": score,
                           "epsilon": summary["epsilon"], "delta": summary["delta"],
                           "accountant": summary["accountant"],
                           "validation_size": summary["evaluated_examples"],
                           "steps": summary["steps"], "ledger": summary["privacy_ledger"]})
        except MissingMetric:
            raise
        except Exception as err:  # a failed trial released steps: its ledger still counts
            log.warning("trial lr=%g failed: %s", lr, err)
            trials.append({"lr": lr, "seed": seed, "score": None, "failed": str(err),
                           "ledger": getattr(err, "ledger", None) or []})
        log.info("cell %s lr=%g: %s=%s", cell, lr, settings.select, trials[-1]["score"])
    done = [t for t in trials if t["score"] is not None and math.isfinite(t["score"])]
    if not done or cfg is None:
        raise TuneError(f"every trial of {' '.join(cell)} failed: " + "; ".join(
            t.get("failed", f"no finite {settings.select} (score {t['score']!r})")
            for t in trials))
    # each trial keeps its own ledger: a later run rebuilds the search's ledger from them
    choice: dict[str, Any] = {"mode": settings.mode, "select": settings.select,
                              "grid": list(settings.lrs),
                              "validation_fraction": settings.validation_fraction,
                              "trials": trials}
    if settings.mode == "unaccounted":
        best = max(done, key=lambda t: t["score"])
    else:
        eps_sel = selection_epsilon(settings, cfg)
        n_val = min(t["validation_size"] for t in done)
        best = done[exponential_mechanism([t["score"] for t in done], float(eps_sel),
                                          1.0 / n_val, selection_rng)]
        ledger = [e for t in trials for e in t["ledger"]]
        delta = next(t["delta"] for t in done)
        accountant = next(t["accountant"] for t in done)
        choice.update(search_ledger=ledger, selection_epsilon=float(eps_sel), delta=delta,
                      accountant=accountant,
                      trials_epsilon=compose_ledgers([ledger], delta, accountant))
        choice["search_epsilon"] = max(choice["trials_epsilon"], float(eps_sel))
    choice["overrides"] = {"method.optimizer.lr": best["lr"]}
    # a choice at the end of the grid says the grid may be too narrow (tables flag it)
    choice["at_grid_edge"] = best["lr"] in (min(settings.lrs), max(settings.lrs)) and len(
        settings.lrs) > 1
    if choice["at_grid_edge"]:
        log.warning("%s: the chosen lr %g is at the edge of the grid", cell, best["lr"])
    choice["key"] = cfg_cell_key(cfg)
    return choice


class TuneError(DPBenchError):
    """A search could not choose (every trial failed); the CLI prints it in one line."""


class MissingMetric(ConfigError):
    """``--select`` names a metric the cell's task does not report."""


def check_settings(settings: TuneSettings) -> None:
    """Raise ConfigError naming the option if ``settings`` cannot make a choice."""
    if settings.mode not in ("accounted", "unaccounted"):
        raise ConfigError(f"--mode must be accounted or unaccounted (got {settings.mode!r})")
    if not settings.lrs:
        raise ConfigError("--lrs needs at least one learning rate")
    for lr in settings.lrs:
        if (problem := positive_finite_problem(lr)) is not None:
            raise ConfigError(f"--lrs: every learning rate {problem}")
    if settings.mode == "accounted" and settings.select != "accuracy":
        raise ConfigError("--select: accounted tuning selects on accuracy (bounded sensitivity "
                          f"1/n_val); got --select {settings.select}")
    eps = settings.selection_epsilon
    if eps is not None and (problem := positive_finite_problem(eps)) is not None:
        raise ConfigError(f"--selection-epsilon {problem}; omit it to use the cell's target "
                          "epsilon")
    if not 0.0 < settings.validation_fraction < 1.0:
        raise ConfigError("--validation-fraction must be in (0, 1) (got "
                          f"{settings.validation_fraction!r})")


def selection_epsilon(settings: TuneSettings, cfg: DictConfig) -> float:
    """Return the selection's epsilon: ``--selection-epsilon``, else the cell's target.

    ConfigError (before any trial, when called on the cell's config) if neither is set: an
    accounted search needs a private cell or an explicit selection epsilon.
    """
    if settings.selection_epsilon is not None:
        return float(settings.selection_epsilon)
    target = cfg.privacy.get("target_epsilon") if cfg.privacy.get("enabled", True) else None
    if target is None:
        raise ConfigError(f"--mode accounted: the cell {cfg_cell_key(cfg)} has no target "
                          "epsilon; give --selection-epsilon, or tune it --mode unaccounted")
    return float(target)


def check_cell(cfg: DictConfig, settings: TuneSettings) -> None:
    """Refuse, before any trial, a cell this search cannot tune (ConfigError naming why)."""
    if settings.mode == "accounted":
        from dpbench.methods import get_method

        if not get_method(cfg.method.name).private or not cfg.privacy.get("enabled", True):
            raise ConfigError(f"--mode accounted: method {cfg.method.name} with privacy="
                              f"{cfg.privacy.name} is not private (epsilon = inf), so there is "
                              "no epsilon to account; use --mode unaccounted")
        selection_epsilon(settings, cfg)
    if "lr" not in (cfg.method.get("optimizer") or {}):
        raise ConfigError(f"method {cfg.method.name}: method.optimizer has no lr to tune")


def expand_cells(overrides: Sequence[str]) -> list[list[str]]:
    """Return the cartesian product of ``key=a,b,c`` overrides (bracketed values kept whole)."""
    cells: list[list[str]] = [[]]
    for item in overrides:
        key, sep, value = item.partition("=")
        values = [value] if not sep or value.startswith(("[", "{", "'", '"')) else value.split(",")
        cells = [[*cell, f"{key}={v}" if sep else item] for cell in cells for v in values]
    return cells
