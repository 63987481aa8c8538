"""DP hyper-parameter optimisation by random search, with the search's privacy accounted.

Zhao et al. 2025 (Sec. 6) tune lr and B (and C_LB) by random search with a fixed number of
trials and compare how robust bounded and unbounded adaptive clipping are to it.

Privacy of the search (what ``composed_epsilon`` reports): K trials, fixed in advance, are K
adaptively chosen DP training runs on the same private data. Their releases compose, so the
whole search is the composition of every trial's Gaussian subsampled steps; dpbench feeds the
concatenated privacy ledgers of all trials to one accountant of ``dpbench.privacy``
(``compose_ledgers``; the trials' own accountant) and reports that epsilon. A trial that fails
after releasing steps keeps its ledger: those releases happened and are composed too.
Composition of independent mechanisms needs independent randomness: every trial gets its own
run seed, spawned from the search's master seed (``numpy.random.SeedSequence`` through
``dpbench.utils.seeding``), so no two trials share a Poisson sampler or a noise stream; the
hyper-parameter draws are another spawned stream.

Selection never reads the test split. Every trial runs with ``evaluation.split=validation``
(as ``dpbench-tune`` does): it trains on the training set minus a fixed validation split
(``dpbench.data.base.carve_validation``: a data-independent permutation, the same for every
trial) and is scored on that split. The best validation score wins; only then is the selected
trial's trained model evaluated on the data set's real test split, and no other trial is ever
scored on it, so the reported test accuracy is not selection-biased. At most the current best
trial's model is kept in memory. An ``evaluation.split`` other than validation in the
overrides is refused before any training. ``hpo.json`` records the split (fraction, seed,
sizes) and the test split's size.

What the search's epsilon covers: the examples the trials trained on. With respect to them,
choosing a trial by its score on the disjoint validation split is post-processing (Dwork and
Roth 2014, Prop. 2.1) and costs nothing more. The validation examples themselves are read by
the selection without noise and are not covered, as in ``dpbench-tune --mode unaccounted``
(docs/tuning-and-claims.md). (Liu and Talwar 2019 and Papernot and Steinke 2022 give tighter
bounds for a *random* number of trials; with a fixed K, composition is the theorem that
applies.) The selected trial is the reported model: it is not retrained on the full training
set, which would be one more release to compose. docs/audit-and-hpo.md describes the search.

    python -m dpbench.hpo --trials 20 --out outputs/hpo -- experiment=bounded_adaclip_dutch_cpu
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, Dataset

from dpbench.config.compose import compose_config
from dpbench.data.base import VALIDATION_SPLIT_SEED
from dpbench.errors import ConfigError
from dpbench.experiment import build_trainer, load_data
from dpbench.privacy import DEFAULT_ACCOUNTANT
from dpbench.privacy.composition import compose_ledgers
from dpbench.training.loop import Trainer
from dpbench.training.prefix_cache import PrefixCachedModel, cache_features
from dpbench.utils.io import atomic_write_json
from dpbench.utils.seeding import stream_seed

log = logging.getLogger(__name__)

#: appended to every trial's overrides: trials are scored on the validation split only
VALIDATION_SPLIT = "evaluation.split=validation"


def search_streams(master_seed: int, trials: int) -> tuple[int, list[int]]:
    """Return the seed of the hyper-parameter draws and one distinct run seed per trial.

    Both come from ``master_seed`` through the run's stream registry (``stream_seed``: the
    ``hpo_draws`` stream, and the ``hpo_trial`` stream indexed by trial), so the draws and
    every trial's run (which spawns its own sampler and noise streams from its seed) never
    share a seed.
    """
    seeds = [stream_seed(master_seed, "hpo_trial", i) for i in range(trials)]
    if len(set(seeds)) != len(seeds):  # 63-bit seeds: never in practice, but never silent
        raise ConfigError(f"--seed {master_seed}: two trials drew the same run seed")
    return stream_seed(master_seed, "hpo_draws"), seeds


def sample_trials(trials: int, seed: int, lr_range: tuple[float, float],
                  batch_sizes: list[int], clip_floors: list[float] | None) -> list[dict]:
    """Return ``trials`` configurations: lr log-uniform in lr_range, B and C_LB uniform.

    C_LB has its own spawned stream, so methods searched with the same seed share their
    (lr, B) draws.
    """
    rng, floor_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    out = []
    for _ in range(trials):
        trial = {"method.optimizer.lr": float(np.exp(rng.uniform(*np.log(lr_range)))),
                 "trainer.batch_size": int(rng.choice(batch_sizes))}
        if clip_floors:
            trial["method.settings.clip_floor"] = float(floor_rng.choice(clip_floors))
        out.append(trial)
    return out


def composed_epsilon(ledgers: list[list[dict]], delta: float, accountant: str = "rdp") -> float:
    """Return epsilon of running every ledger's steps in sequence (adaptive composition)."""
    return compose_ledgers(ledgers, delta, accountant)


def check_base_overrides(base: list[str]) -> None:
    """Refuse, before any training, overrides that would break the search's guarantees.

    ``seed=``: every trial must draw its own noise. ``evaluation.split`` other than
    ``validation`` (or the whole ``evaluation`` node): selection would read the test split.
    """
    for override in base:
        key, _, value = override.lstrip("+~").partition("=")
        if key == "seed":
            raise ConfigError("seed: an HPO search spawns one run seed per trial from its "
                              "master seed (--seed); do not set seed= in the overrides")
        if key == "evaluation" or (key == "evaluation.split" and (
                override.startswith("~") or value != "validation")):
            raise ConfigError(f"evaluation.split: an HPO search scores its trials on the "
                              f"validation split carved from the training set and reads the "
                              f"test split only for the selected trial; {override!r} would "
                              f"let the test split drive the selection")


def run_trial(overrides: list[str], run_dir: Path | None,
              callbacks: list | None = None) -> tuple[dict[str, Any], Trainer | None]:
    """Train one trial and score it on the validation split; return (record, trainer).

    The composed config must say ``evaluation.split=validation``: the trial trains on the
    training set minus a fixed validation split (``carve_validation``) and its metrics
    (``validation``) are computed on that split, never on the test split. The trainer (with
    the trained model) is returned so that the search can keep the best one; it is None for a
    failed trial. A trial that fails during training returns a ``failed`` record that still
    carries the ledger of the steps it released (they count towards the search's epsilon).
    """
    cfg = compose_config(overrides)
    split = (cfg.get("evaluation") or {}).get("split")
    if split != "validation":
        raise ConfigError(f"evaluation.split: an HPO trial is scored on the validation split "
                          f"(got {split!r})")
    trainer = build_trainer(cfg, run_dir, callbacks)
    facts = {**_privacy_facts(trainer), "validation_split": _split_facts(cfg, trainer)}
    try:
        summary = trainer.fit()
    except Exception as err:  # a diverged trial still spent its privacy: keep its ledger
        return {"overrides": overrides, "failed": f"{type(err).__name__}: {err}",
                "validation": {}, "epsilon": trainer.epsilon(),
                "privacy_ledger": trainer.ledger.to_json(), **facts}, None
    # the final evaluation of fit() ran on trainer.data.test, the carved validation split
    return {"overrides": overrides, "epsilon": summary["epsilon"],
            "privacy_ledger": summary["privacy_ledger"], **facts,
            "validation": summary["metrics"]}, trainer


def _split_facts(cfg: Any, trainer: Trainer) -> dict[str, Any]:
    """Return the validation split a trial used: fraction, seed and sizes."""
    n_train, n_val = len(trainer.data.train), len(trainer.data.test)
    return {"fraction": float(cfg.evaluation.validation_fraction),
            "seed": VALIDATION_SPLIT_SEED, "training_set_size": n_train + n_val,
            "validation_size": n_val, "trial_train_size": n_train}


def evaluate_on_test(trainer: Trainer, test: Dataset) -> dict[str, Any]:
    """Return the trained model's metrics on ``test`` (raw examples of the data set's test split).

    The search calls it for the selected trial only, after the selection, with the test split
    loaded by ``load_data`` (nothing carved); nothing else in the search reads the test split.
    """
    bs = trainer.settings.eval_batch_size
    if isinstance(trainer.model, PrefixCachedModel):  # the trial trained on cached features
        test = cache_features(trainer.model.model, test, trainer.device, bs)
    loader = DataLoader(test, batch_size=bs)
    return trainer.method.evaluate(trainer.task, trainer.model, loader, trainer.device)


def _privacy_facts(trainer: Any) -> dict[str, Any]:
    """Return the trial's delta and the accountant it ended with (after any fallback)."""
    return {"delta": trainer.plan.delta,
            "accountant": trainer.accountant.mechanism if trainer.accountant else None}


def _search_accountant(records: list[dict]) -> str:
    """Return the trials' accountant, or the default one (valid for any mix) if they differ."""
    names = {r["accountant"] for r in records if r.get("accountant")}
    return names.pop() if len(names) == 1 else DEFAULT_ACCOUNTANT


def random_search(base: list[str], trials: list[dict], select: str,
                  out: Path | None = None, seeds: list[int] | None = None) -> dict[str, Any]:
    """Run the trials, select the best by its validation ``select`` metric, account the search.

    Every trial is scored on the fixed validation split (``evaluation.split=validation`` is
    appended to its overrides); only the selected trial is evaluated on the test split, after
    all trials ran (``best["test"]``). At most the current best trial's trained model is kept.
    ``seeds``: one run seed per trial (default: ``search_streams(0, len(trials))``); a
    ``seed=`` or an ``evaluation.split`` other than validation in ``base`` is refused.
    """
    check_base_overrides(base)
    seeds = seeds if seeds is not None else search_streams(0, len(trials))[1]
    if len(seeds) != len(trials) or len(set(seeds)) != len(seeds):
        raise ConfigError("random_search needs one distinct seed per trial")
    records: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    best_trainer: Trainer | None = None
    for i, (trial, seed) in enumerate(zip(trials, seeds)):
        overrides = [*base, *(f"{k}={v}" for k, v in trial.items()), VALIDATION_SPLIT,
                     f"seed={seed}"]
        try:
            rec, trainer = run_trial(overrides, None)
        except Exception as err:  # failed before training: nothing was released
            rec, trainer = {"overrides": overrides, "failed": f"{type(err).__name__}: {err}",
                            "validation": {}, "privacy_ledger": []}, None
        if "failed" in rec:
            log.warning("trial %d failed: %s", i, rec["failed"])
        record = {"trial": i, "seed": seed, **trial, **rec}
        records.append(record)
        score = _score(rec["validation"], select) if trainer is not None else None
        log.info("trial %d: %s -> validation %s = %s", i, trial, select, score)
        if score is not None and (best is None or score > best["validation"][select]):
            best, best_trainer = record, trainer  # the previous best's model is released
        del trainer
    if best is not None:  # the test split is read here, for the selected trial only
        test = load_data(compose_config(best["overrides"])).test
        best = {**best, "test": evaluate_on_test(best_trainer, test), "test_size": len(test)}
    best_trainer = None
    delta = next((r["delta"] for r in records if r.get("delta")), None)
    accountant = _search_accountant(records)
    ledgers = [r["privacy_ledger"] for r in records]
    result = {
        "select_metric": select, "selection_split": "validation",
        "validation_split": next((r["validation_split"] for r in records
                                  if r.get("validation_split")), None),
        "trials": records, "best": best,
        "search_epsilon": (composed_epsilon(ledgers, delta, accountant) if delta else math.nan),
        "search_delta": delta, "search_accountant": accountant, "trial_seeds": list(seeds),
        "per_trial_epsilon": [r.get("epsilon") for r in records],
        "theorem": "adaptive composition of all trials, failed ones included (one accountant "
                   "over the concatenated ledgers) covers the examples the trials trained on; "
                   "selection on the validation split is post-processing for them (the "
                   "validation examples are read without noise and are not covered); each "
                   "trial has its own spawned seed",
    }
    if any("failed" in r for r in records):
        result["note"] = ("failed trials are listed; the steps they released before failing "
                          "are in their privacy_ledger and in search_epsilon")
    if out is not None:
        atomic_write_json(out / "hpo.json", result)
    return result


def _score(metrics: dict[str, Any], select: str) -> float | None:
    """Return the trial's validation ``select`` metric (None if not finite; refused if absent)."""
    if select not in metrics:
        raise ConfigError(f"--select {select}: the trials report "
                          f"{', '.join(k for k, v in metrics.items() if not isinstance(v, list))}")
    score = float(metrics[select])
    return score if math.isfinite(score) else None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--seed", type=int, default=0,
                   help="master seed: the trials' run seeds and the draws are spawned from it")
    p.add_argument("--lr", type=float, nargs=2, default=(1.0, 10.0))
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--clip-floors", type=float, nargs="*", default=None)
    p.add_argument("--select", default="worst_class_accuracy")
    p.add_argument("--out", type=Path, default=Path("outputs/hpo"))
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=...")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    args.out.mkdir(parents=True, exist_ok=True)
    draws, seeds = search_streams(args.seed, args.trials)
    trials = sample_trials(args.trials, draws, tuple(args.lr), args.batch_sizes,
                           args.clip_floors)
    base = ["logger=none", "trainer.progress=false", "trainer.checkpoint=false",
            *args.overrides]
    result = {"master_seed": args.seed, **random_search(base, trials, args.select, None, seeds)}
    atomic_write_json(args.out / "hpo.json", result)
    best = result["best"] or {}
    print(json.dumps({"search_epsilon": result["search_epsilon"],
                      "best_trial": best.get("trial"),
                      "best_test": {k: v for k, v in best.get("test", {}).items()
                                    if not isinstance(v, list)}}, indent=1))


if __name__ == "__main__":
    main()
