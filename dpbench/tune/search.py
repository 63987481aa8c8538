"""The tuning protocol: per cell, search on a validation split, then train the choice on
every seed and evaluate on the test split (docs/tuning-and-claims.md, "Tuning").

- Strategies: ``grid`` (one trial per learning rate of ``lrs``) or ``random`` (``trials``
  configurations drawn in advance: the learning rate log-uniform in ``lr_range``, and, if
  given, the batch size from ``batch_sizes`` and the clip floor from ``clip_floors``). Both
  run their trials through the same loop and make the same choice record.
- Trials train on the training set minus a fixed validation split (``evaluation.split=
  validation``) and are scored on that validation split; the test split is never read.
- ``unaccounted``: the best validation score wins (what papers usually do); the selection's
  privacy cost is not counted, and every table says so. The choice still records the
  composed epsilon of all trials (``trials_epsilon``), which covers the examples the trials
  trained on but not the validation examples the selection read without noise.
- ``accounted``: the choice is made by the exponential mechanism on validation accuracy
  (McSherry and Talwar 2007; utility sensitivity 1/n_val, so P(i) ~ exp(eps_sel * acc_i *
  n_val / 2)), and every run that uses the choice reports the total epsilon of all trials,
  the selection and itself (``choices.total_epsilon``).
Every trial gets its own run seed, the draws and the selection their own streams, all
spawned from one master seed through the run's stream registry (``dpbench.utils.seeding``:
the ``hpo_trial`` stream indexed by trial, ``hpo_draws`` and ``hpo_selection``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from omegaconf import DictConfig

from dpbench.config.compose import compose_config
from dpbench.errors import ConfigError, DPBenchError
from dpbench.privacy.composition import compose_ledgers, composed_relation
from dpbench.privacy.selection import exponential_mechanism
from dpbench.tune.choices import (
    MAX_TRIALS,
    SELECTION_EPSILON_MIN,
    cfg_cell_key,
    positive_finite_problem,
)
from dpbench.utils.seeding import stream_seed

log = logging.getLogger(__name__)

STRATEGIES = ("grid", "random")
#: the grid of learning rates and the random strategy's range, unless told otherwise
DEFAULT_LRS = (0.01, 0.03, 0.1, 0.3, 1.0)
DEFAULT_LR_RANGE = (0.01, 1.0)
#: the keys a trial sets
LR, BATCH_SIZE, CLIP_FLOOR = ("method.optimizer.lr", "trainer.batch_size",
                             "method.settings.clip_floor")


@dataclass
class TuneSettings:
    """What to search and how (``dpbench-tune`` options)."""

    lrs: Sequence[float] = DEFAULT_LRS  # grid
    mode: str = "unaccounted"
    select: str = "accuracy"
    validation_fraction: float = 0.15
    selection_epsilon: float | None = None  # accounted mode; None: the cell's target
    master_seed: int = 0
    extra: list[str] = field(default_factory=list)  # overrides for every trial
    strategy: str = "grid"
    trials: int = 20  # random: the number of trials
    lr_range: Sequence[float] = DEFAULT_LR_RANGE  # random: log-uniform in [low, high]
    batch_sizes: Sequence[int] | None = None  # random: drawn uniformly (None: not searched)
    clip_floors: Sequence[float] | None = None  # random: drawn uniformly (None: not searched)


def spawn_seeds(master_seed: int, n_trials: int) -> tuple[list[int], np.random.Generator]:
    """Return one run seed per trial and the selection's generator, all independent streams
    of ``master_seed`` (``hpo_trial`` indexed by trial, ``hpo_selection``)."""
    seeds = [stream_seed(master_seed, "hpo_trial", i) for i in range(n_trials)]
    if len(set(seeds)) != len(seeds):  # 63-bit seeds: never in practice, but never silent
        raise ConfigError(f"--master-seed {master_seed}: two trials drew the same run seed")
    return seeds, np.random.default_rng(stream_seed(master_seed, "hpo_selection"))


def sample_trials(n_trials: int, master_seed: int, lr_range: Sequence[float],
                  batch_sizes: Sequence[int] | None = None,
                  clip_floors: Sequence[float] | None = None) -> list[dict[str, Any]]:
    """Return the random strategy's trials: the overrides of each, drawn before any training.

    The learning rate is log-uniform in ``lr_range`` and the batch size uniform over
    ``batch_sizes`` (stream ``hpo_draws``, index 0); the clip floor is uniform over
    ``clip_floors`` on a stream of its own (index 1), so cells searched with and without
    floors share their (lr, B) draws.
    """
    rng = np.random.default_rng(stream_seed(master_seed, "hpo_draws", 0))
    floor_rng = np.random.default_rng(stream_seed(master_seed, "hpo_draws", 1))
    low, high = np.log(np.asarray(lr_range, dtype=float))
    out = []
    for _ in range(n_trials):
        trial: dict[str, Any] = {LR: float(np.exp(rng.uniform(low, high)))}
        if batch_sizes:
            trial[BATCH_SIZE] = int(rng.choice(list(batch_sizes)))
        if clip_floors:
            trial[CLIP_FLOOR] = float(floor_rng.choice(list(clip_floors)))
        out.append(trial)
    return out


def trial_overrides(settings: TuneSettings) -> list[dict[str, Any]]:
    """Return the overrides of every trial of ``settings``' strategy, in order."""
    if settings.strategy == "random":
        return sample_trials(settings.trials, settings.master_seed, settings.lr_range,
                             settings.batch_sizes, settings.clip_floors)
    return [{LR: lr} for lr in settings.lrs]


def search_space(settings: TuneSettings) -> dict[str, Any]:
    """Return what the strategy searched over (recorded in the choice)."""
    if settings.strategy == "random":
        return {"trials": settings.trials, "lr_range": list(settings.lr_range),
                "batch_sizes": list(settings.batch_sizes or []) or None,
                "clip_floors": list(settings.clip_floors or []) or None}
    return {"lrs": list(settings.lrs)}


def search_cell(cell: list[str], settings: TuneSettings,
                run: Callable[[list[str]], tuple[DictConfig, dict[str, Any]]]) -> dict[str, Any]:
    """Run the trials of one cell and return its choice (see the module docstring).

    ``run(overrides)`` trains one configuration and returns (config, summary); failed trials
    raise, and their ledger (``err.ledger``) is still composed into the search.
    """
    check_settings(settings)
    planned = trial_overrides(settings)
    seeds, selection_rng = spawn_seeds(settings.master_seed, len(planned))
    trials, cfg = [], None
    for tried, seed in zip(planned, seeds):
        overrides = [*cell, *settings.extra, *(f"{k}={v}" for k, v in tried.items()),
                     "evaluation.split=validation",
                     f"evaluation.validation_fraction={settings.validation_fraction}",
                     f"seed={seed}"]
        try:
            cfg, summary = run(overrides)
            if settings.select not in summary["metrics"]:  # stop before the other trials
                raise MissingMetric(f"--select {settings.select}: the trials report "
                                    f"{', '.join(sorted(summary['metrics'])) or 'no metric'}")
            score = summary["metrics"].get(settings.select)
            trials.append({"lr": tried[LR], "overrides": tried, "seed": seed, "score": score,
                           "epsilon": summary["epsilon"], "delta": summary["delta"],
                           "accountant": summary["accountant"],
                           "validation_size": summary["evaluated_examples"],
                           "steps": summary["steps"], "ledger": summary["privacy_ledger"]})
        except MissingMetric:
            raise
        except Exception as err:  # a failed trial released steps: its ledger still counts
            log.warning("trial %s failed: %s", tried, err)
            trials.append({"lr": tried[LR], "overrides": tried, "seed": seed, "score": None,
                           "failed": str(err), "ledger": getattr(err, "ledger", None) or []})
        log.info("cell %s %s: %s=%s", cell, tried, settings.select, trials[-1]["score"])
    done = [t for t in trials if t["score"] is not None and math.isfinite(t["score"])]
    if not done or cfg is None:
        raise TuneError(f"every trial of {' '.join(cell)} failed: " + "; ".join(
            t.get("failed", f"no finite {settings.select} (score {t['score']!r})")
            for t in trials))
    # each trial keeps its own ledger: a later run rebuilds the search's ledger from them
    choice: dict[str, Any] = {"mode": settings.mode, "select": settings.select,
                              "strategy": settings.strategy, "space": search_space(settings),
                              "grid": [t["lr"] for t in trials],
                              "validation_fraction": settings.validation_fraction,
                              "trials": trials}
    if settings.mode == "unaccounted":
        best = max(done, key=lambda t: t["score"])
    else:
        eps_sel = selection_epsilon(settings, cfg)
        n_val = min(t["validation_size"] for t in done)
        best = done[exponential_mechanism([t["score"] for t in done], float(eps_sel),
                                          1.0 / n_val, selection_rng)]
    # every trial composes, failed ones included (the steps they released)
    private = all(t.get("accountant") and t.get("delta") for t in done)
    if private or settings.mode == "accounted":
        ledger = [e for t in trials for e in t["ledger"]]
        delta = next(t["delta"] for t in done)
        accountant = next(t["accountant"] for t in done)
        choice.update(search_ledger=ledger, delta=delta, accountant=accountant,
                      trials_epsilon=compose_ledgers([ledger], delta, accountant),
                      trials_epsilon_neighbouring=composed_relation([ledger]))
    if settings.mode == "accounted":
        choice["selection_epsilon"] = float(eps_sel)
        choice["search_epsilon"] = max(choice["trials_epsilon"], float(eps_sel))
    choice["overrides"] = dict(best["overrides"])
    # a choice at the end of the lrs tried says the range may be too narrow (tables flag it)
    lrs = choice["grid"]
    choice["at_grid_edge"] = best["lr"] in (min(lrs), max(lrs)) and len(lrs) > 1
    if choice["at_grid_edge"]:
        log.warning("%s: the chosen lr %g is at the edge of the lrs tried", cell, best["lr"])
    # the cell's own key: a trial's config differs from the cell's in what the trial tuned
    choice["key"] = cfg_cell_key(compose_config([*cell, *settings.extra]))
    return choice


class TuneError(DPBenchError):
    """A search could not choose (every trial failed); the CLI prints it in one line."""


class MissingMetric(ConfigError):
    """``--select`` names a metric the cell's task does not report."""


def check_settings(settings: TuneSettings) -> None:
    """Raise ConfigError naming the option if ``settings`` cannot make a choice."""
    if settings.mode not in ("accounted", "unaccounted"):
        raise ConfigError(f"--mode must be accounted or unaccounted (got {settings.mode!r})")
    if settings.strategy not in STRATEGIES:
        raise ConfigError(f"--strategy must be {' or '.join(STRATEGIES)} (got "
                          f"{settings.strategy!r})")
    if settings.strategy == "grid":
        if not settings.lrs:
            raise ConfigError("--lrs needs at least one learning rate")
        for lr in settings.lrs:
            if (problem := positive_finite_problem(lr)) is not None:
                raise ConfigError(f"--lrs: every learning rate {problem}")
    else:
        _check_random(settings)
    if settings.mode == "accounted" and settings.select != "accuracy":
        raise ConfigError("--select: accounted tuning selects on accuracy (bounded sensitivity "
                          f"1/n_val); got --select {settings.select}")
    eps = settings.selection_epsilon
    if eps is not None and (problem := positive_finite_problem(eps)) is not None:
        raise ConfigError(f"--selection-epsilon {problem}; omit it to use the cell's target "
                          "epsilon")
    if eps is not None and eps < SELECTION_EPSILON_MIN:
        raise ConfigError(f"--selection-epsilon must be >= {SELECTION_EPSILON_MIN:g} (got "
                          f"{eps!r}); omit it to use the cell's target epsilon")
    if not 0.0 < settings.validation_fraction < 1.0:
        raise ConfigError("--validation-fraction must be in (0, 1) (got "
                          f"{settings.validation_fraction!r})")


def _check_random(settings: TuneSettings) -> None:
    """Raise ConfigError naming the option if the random strategy's space is unusable."""
    n = settings.trials
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_TRIALS:
        raise ConfigError(f"--trials must be an integer in [1, {MAX_TRIALS}] (got {n!r}): a "
                          "choices file holds at most that many trials")
    bounds = list(settings.lr_range)
    if len(bounds) != 2 or any(positive_finite_problem(v) for v in bounds) or (
            bounds[0] > bounds[1]):
        raise ConfigError(f"--lr-range must be two finite numbers LOW,HIGH with 0 < LOW <= HIGH "
                          f"(got {settings.lr_range!r})")
    for b in settings.batch_sizes or []:
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ConfigError(f"--batch-sizes must be integers >= 1 (got {b!r})")
    for floor in settings.clip_floors or []:
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not (
                math.isfinite(floor) and floor >= 0):
            raise ConfigError(f"--clip-floors must be finite numbers >= 0 (got {floor!r})")


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
    if settings.strategy == "random" and settings.clip_floors and "clip_floor" not in (
            cfg.method.get("settings") or {}):
        raise ConfigError(f"--clip-floors: method {cfg.method.name} has no "
                          "method.settings.clip_floor to tune")


def expand_cells(overrides: Sequence[str]) -> list[list[str]]:
    """Return the cartesian product of ``key=a,b,c`` overrides (bracketed values kept whole)."""
    cells: list[list[str]] = [[]]
    for item in overrides:
        key, sep, value = item.partition("=")
        values = [value] if not sep or value.startswith(("[", "{", "'", '"')) else value.split(",")
        cells = [[*cell, f"{key}={v}" if sep else item] for cell in cells for v in values]
    return cells
