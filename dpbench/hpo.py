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
hyper-parameter draws are another spawned stream. Choosing the best trial by
a score on *held-out* data (never the training set) is post-processing (Dwork and Roth 2014,
Prop. 2.1) and costs nothing more. (Liu and Talwar 2019 and Papernot and Steinke 2022 give
tighter bounds for a *random* number of trials; with a fixed K, composition is the theorem
that applies.) Selection uses one half of the test set (``validation``); the selected trial is
reported on the other half (``test``), so the reported accuracy is not selection-biased.

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
from torch.utils.data import DataLoader, Subset

from dpbench.data.base import SPLIT_SEED
from dpbench.errors import ConfigError
from dpbench.privacy import DEFAULT_ACCOUNTANT
from dpbench.privacy.composition import compose_ledgers
from dpbench.utils.io import atomic_write_json
from dpbench.utils.seeding import stream_seed

log = logging.getLogger(__name__)


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


def _halves(n: int) -> tuple[list[int], list[int]]:
    perm = np.random.default_rng(SPLIT_SEED + 3).permutation(n)
    return sorted(perm[: n // 2].tolist()), sorted(perm[n // 2:].tolist())


def run_trial(overrides: list[str], run_dir: Path | None,
              callbacks: list | None = None) -> dict[str, Any]:
    """Train one trial; return its record with validation and test metrics (test halves).

    A trial that fails during training returns a ``failed`` record that still carries the
    ledger of the steps it released (they count towards the search's epsilon).
    """
    from dpbench.config.compose import compose_config
    from dpbench.experiment import build_trainer

    cfg = compose_config(overrides)
    trainer = build_trainer(cfg, run_dir, callbacks)
    try:
        summary = trainer.fit()
    except Exception as err:  # a diverged trial still spent its privacy: keep its ledger
        return {"overrides": overrides, "failed": f"{type(err).__name__}: {err}",
                "validation": {}, "test": {}, "epsilon": trainer.epsilon(),
                "privacy_ledger": trainer.ledger.to_json(), **_privacy_facts(trainer)}
    val_idx, test_idx = _halves(len(trainer.data.test))
    bs = trainer.settings.eval_batch_size
    scores = {}
    for name, idx in (("validation", val_idx), ("test", test_idx)):
        loader = DataLoader(Subset(trainer.data.test, idx), batch_size=bs)
        scores[name] = trainer.method.evaluate(trainer.task, trainer.model, loader,
                                               trainer.device)
    return {"overrides": overrides, "epsilon": summary["epsilon"],
            "privacy_ledger": summary["privacy_ledger"], **_privacy_facts(trainer), **scores}


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
    """Run the trials, select the best by the validation ``select`` metric, account the search.

    ``seeds``: one run seed per trial (default: ``search_streams(0, len(trials))``); a
    ``seed=`` in ``base`` is refused, since every trial must draw its own noise.
    """
    if any(o.lstrip("+~").split("=", 1)[0] == "seed" for o in base):
        raise ConfigError("seed: an HPO search spawns one run seed per trial from its master "
                          "seed (--seed); do not set seed= in the overrides")
    seeds = seeds if seeds is not None else search_streams(0, len(trials))[1]
    if len(seeds) != len(trials) or len(set(seeds)) != len(seeds):
        raise ConfigError("random_search needs one distinct seed per trial")
    records = []
    for i, (trial, seed) in enumerate(zip(trials, seeds)):
        overrides = [*base, *(f"{k}={v}" for k, v in trial.items()), f"seed={seed}"]
        try:
            rec = run_trial(overrides, None)
        except Exception as err:  # failed before training: nothing was released
            rec = {"overrides": overrides, "failed": f"{type(err).__name__}: {err}",
                   "validation": {}, "test": {}, "privacy_ledger": []}
        if "failed" in rec:
            log.warning("trial %d failed: %s", i, rec["failed"])
        records.append({"trial": i, "seed": seed, **trial, **rec})
        log.info("trial %d: %s -> %s", i, trial, rec.get("validation", {}).get(select))
    done = [r for r in records if r["validation"]]
    best = max(done, key=lambda r: r["validation"][select]) if done else None
    delta = next((r["delta"] for r in records if r.get("delta")), None)
    accountant = _search_accountant(records)
    ledgers = [r["privacy_ledger"] for r in records]
    result = {
        "select_metric": select, "trials": records, "best": best,
        "search_epsilon": (composed_epsilon(ledgers, delta, accountant) if delta else math.nan),
        "search_delta": delta, "search_accountant": accountant, "trial_seeds": list(seeds),
        "per_trial_epsilon": [r.get("epsilon") for r in records],
        "theorem": "adaptive composition of all trials, failed ones included (one accountant "
                   "over the concatenated ledgers); selection on held-out data is "
                   "post-processing; each trial has its own spawned seed",
    }
    if any("failed" in r for r in records):
        result["note"] = ("failed trials are listed; the steps they released before failing "
                          "are in their privacy_ledger and in search_epsilon")
    if out is not None:
        atomic_write_json(out / "hpo.json", result)
    return result


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
