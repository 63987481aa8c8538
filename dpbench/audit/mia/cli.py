"""``dpbench-mia``: membership inference against a cell's method, epsilon and seed.

Config-driven like ``dpbench`` (``conf/mia.yaml`` = ``conf/config.yaml`` + ``conf/mia``):
``dpbench-mia method=dpsgd privacy=eps1``, sweeps with ``-m``. The run trains
``mia.targets + mia.references`` models on random halves of a pool (``models.py``), scores
the targets' members against non-members with each attack (``scoring.py``) and writes
``results.json`` (``kind: mia``, the target's accounted epsilon and accuracy, every attack's
metrics with intervals in the ``mia`` block, the headline attack's as ``mia_*`` fields),
``roc.csv``, ``roc.png`` and ``scores.npz`` (``scores_file.py``). Every attack's epsilon
lower bound comes with its ceiling (the bound of a perfect attack at this size); a note says
when the accounted epsilon lies above it, and a WARNING names both figures when a bound
exceeds the accounted epsilon (flagged as ``privacy_violation`` in the record; the exit
code stays 0, as ``dpbench-audit``'s). Bad settings exit 2 before any training and leave
nothing behind. Under ``privacy.unit=user`` whole users are in or out and users are scored
(``users.py``: the pool's users, the split, each attack's aggregate of a user's records).
With ``trainer.resume=true`` a folder holding this very configuration's finished record (signed,
its epsilon re-derived) is handed back without training: a rerun sweep skips finished cells.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from dpbench.config.entry import check_command_line, hydra_entry
from dpbench.errors import ConfigError
from dpbench.logging.records import COMPLETED, RESULTS_NAME, run_record, write_record
from dpbench.runners.job_record import completed_record
from dpbench.runners.locked import run_locked

if TYPE_CHECKING:
    from dpbench.audit.mia.settings import MIASettings
    from dpbench.spec import RunSpec

KIND = "mia"
#: the fewest users a user-level pool may hold (each half needs members and non-members)
MIN_POOL_USERS = 8
HEADER = ("| method | dataset | epsilon | accuracy | attack | AUC [95 % CI] | TPR@0.1%FPR | "
          "TPR@1%FPR | epsilon_lower | ceiling |")
#: the headline attack's values copied to the record's top level (the report's columns)
HEADLINE_KEYS = ("auc", "auc_low", "auc_high", "tpr_at_0p1pct_fpr", "tpr_at_0p1pct_fpr_low",
                 "tpr_at_0p1pct_fpr_high", "tpr_at_1pct_fpr", "tpr_at_1pct_fpr_low",
                 "tpr_at_1pct_fpr_high", "balanced_accuracy")


def mia_settings(cfg: DictConfig) -> MIASettings:
    from dpbench.audit.mia.settings import MIASettings  # its attacks import scipy

    node = OmegaConf.to_container(cfg.get("mia") or {}, resolve=True)
    try:
        return MIASettings(**node)
    except TypeError as err:
        raise ConfigError(f"mia: {err}") from err


def headline_fields(attacks: dict[str, dict[str, Any]], headline: str) -> dict[str, Any]:
    """Return the ``mia_*`` top-level fields of the headline attack."""
    chosen = attacks[headline]
    return {"mia_attack": headline,
            **{f"mia_{key}": chosen[key] for key in HEADLINE_KEYS},
            "mia_epsilon_lower": chosen["epsilon"]["epsilon_lower"],
            "mia_epsilon_point": chosen["epsilon"]["epsilon_point"],
            "mia_epsilon_ceiling": chosen["epsilon"]["ceiling"]}


def exceeding_attacks(attacks: dict[str, dict[str, Any]], epsilon: float) -> list[str]:
    """Return the attacks whose epsilon lower bound exceeds the accounted ``epsilon``."""
    return [name for name, m in attacks.items() if m["epsilon"]["epsilon_lower"] > epsilon]


def mia_messages(record: dict[str, Any]) -> list[str]:
    """Return the notes and warnings a dpbench-mia record calls for (stderr lines).

    A note when the accounted epsilon lies above the headline attack's ceiling (no
    violation above it is detectable at this size); a WARNING per attack whose lower bound
    exceeds the accounted epsilon, naming both figures.
    """
    eps, out = record["epsilon"], []
    ceiling = record.get("mia_epsilon_ceiling")
    if ceiling is not None and math.isfinite(eps) and eps > ceiling:
        out.append(f"dpbench-mia: note: epsilon_lower cannot exceed {ceiling:.3g} at this size "
                   f"({record['mia']['attacks'][record['mia_attack']]['epsilon']['evaluated']} "
                   f"evaluated {record['mia'].get('unit', 'example')}s): this measurement "
                   f"cannot detect a violation above "
                   f"{ceiling:.3g} (the accounted epsilon is {eps:.3g}); raise mia.pool_size or "
                   "mia.targets")
    for name in record["mia"].get("exceeds_accounted", []):
        lower = record["mia"]["attacks"][name]["epsilon"]["epsilon_lower"]
        out.append(f"dpbench-mia: WARNING {name} epsilon_lower = {lower:.4g} exceeds the "
                   f"accounted epsilon {eps:.4g}: the mechanism that ran is less private than "
                   "accounted")
    return out


def run_mia(cfg: DictConfig, run_dir: Path | None = None,
            group: str | None = None) -> dict[str, Any]:
    """Validate a composed config (``build_spec``), then ``mia_run``; return the record."""
    from dpbench.spec import build_spec

    return mia_run(build_spec(cfg), run_dir, group)


def mia_run(spec: RunSpec, run_dir: Path | None = None,
            group: str | None = None) -> dict[str, Any]:
    """Train the models, attack, and (if ``run_dir``) write the record and ROC files, and log
    them to W&B where ``logger`` asks (``group``: the sweep's name). Each model is a run of
    its own seed (``RunSpec.with_seed``, ``experiment.build``)."""
    from dpbench.audit.mia.models import pool_and_population, train_models
    from dpbench.audit.mia.roc_files import write_roc
    from dpbench.audit.mia.scores_file import scores_arrays, write_scores
    from dpbench.audit.mia.scoring import score_attacks
    from dpbench.audit.mia.wandb_log import log_to_wandb
    from dpbench.experiment import load_data

    cfg = spec.cfg
    settings = mia_settings(cfg)
    # the data sizes (and under privacy.unit=user the pool's users) are checked here,
    # before any model trains
    data = load_data(cfg)
    pool, population = pool_and_population(data, settings)
    users = (pool_users_checked(data, cfg, settings, pool.indices)  # type: ignore[attr-defined]
             if spec.privacy.unit == "user" else None)
    outputs = train_models(spec, settings, pool, population, users)
    target = outputs.summaries[0]
    attacks, curves, scores = score_attacks(outputs, settings, target["delta"] or 1e-5, users)
    exceeding = exceeding_attacks(attacks, target["epsilon"])
    broken = ({"broken_on_purpose": f"mia.break_noise_scale={settings.break_noise_scale}: every "
               "model's noise was drawn at this fraction of its calibrated scale while "
               "accounting the planned epsilon (a test of the warnings; not a private run)"}
              if settings.break_noise_scale != 1.0 else {})
    record = {**run_record(cfg, target, COMPLETED), "kind": KIND,
              **headline_fields(attacks, settings.headline),
              "privacy_violation": bool(exceeding), **broken,
              "mia": {"settings": OmegaConf.to_container(cfg.mia, resolve=True),
                      "attacks": attacks, "models": settings.models,
                      "model_epsilons": [s["epsilon"] for s in outputs.summaries],
                      "members_per_target": [int(m.sum()) for m in
                                             outputs.members[:settings.targets]],
                      **({} if users is None else {"unit": "user", **unit_facts(
                          outputs.members[:settings.targets], users, settings.attacks)}),
                      "wall_time_s": outputs.wall_time_s,
                      "exceeds_accounted": exceeding}}
    if run_dir is not None:
        write_scores(run_dir, scores_arrays(outputs, settings.targets, scores, users))
        write_roc(run_dir, curves, {a: m["auc"] for a, m in attacks.items()},
                  f"{cfg.method.name} {cfg.privacy.name} seed {cfg.seed}")
        write_record(run_dir, record)
        log_to_wandb(cfg, record, curves, run_dir, group)
    return record


def pool_users_checked(data: Any, cfg: DictConfig, settings: MIASettings,
                       pool_rows: Any) -> Any:
    """Return each pool record's user under ``privacy.unit=user`` (``users.pool_users``), or
    a one-line ConfigError when the pool holds too few users to attack."""
    import numpy as np

    from dpbench.audit.mia.users import pool_users

    users = pool_users(data, cfg.dataset, settings.seed, np.asarray(pool_rows))
    if int(users.max()) + 1 < MIN_POOL_USERS:
        raise ConfigError(f"mia.pool_size={settings.pool_size} holds {int(users.max()) + 1} "
                          f"users; user-level membership inference needs at least "
                          f"{MIN_POOL_USERS} (raise mia.pool_size or dataset.num_users)")
    return users


def unit_facts(members: Any, users: Any, attacks: list[str]) -> dict[str, Any]:
    """Return the record's user-level facts: the pool's users, the users in each target and
    how each attack combined a user's records (``users.AGGREGATES``)."""
    from dpbench.audit.mia.users import AGGREGATES, pool_facts, user_labels

    return {"pool_users": pool_facts(users),
            "member_users_per_target": [int(user_labels(m, users).sum()) for m in members],
            "aggregate": {a: AGGREGATES[a] for a in attacks}}


def check_mia_folder(run_dir: Path) -> None:
    """Raise ConfigError unless ``run_dir`` is empty or holds an earlier dpbench-mia run."""
    from dpbench.utils.safe_json import UnsafeFile, read_json

    results = run_dir / RESULTS_NAME
    found = [n for n in ("config.yaml", "checkpoint.pt", "run.log") if (run_dir / n).exists()]
    if results.exists() or results.is_symlink():
        try:
            record = read_json(results)
        except (UnsafeFile, OSError):
            record = None
        if not isinstance(record, dict) or record.get("kind") != KIND:
            found.append(RESULTS_NAME)
    if found:
        raise ConfigError(f"hydra.run.dir={run_dir} holds another kind of run "
                          f"({', '.join(found)}); dpbench-mia writes only into an empty "
                          "folder or an earlier dpbench-mia run's")


def table_row(record: dict[str, Any]) -> str:
    eps = record["epsilon"]
    return (f"| {record['method']} | {record['dataset']} | "
            f"{eps if math.isinf(eps) else round(eps, 3)} | "
            f"{record['metrics'].get('accuracy', float('nan')):.3f} | {record['mia_attack']} | "
            f"{record['mia_auc']:.3f} [{record['mia_auc_low']:.3f}, "
            f"{record['mia_auc_high']:.3f}] | {record['mia_tpr_at_0p1pct_fpr']:.4f} | "
            f"{record['mia_tpr_at_1pct_fpr']:.4f} | {record['mia_epsilon_lower']:.3f} | "
            f"{_ceiling(record)} |")


def _ceiling(record: dict[str, Any]) -> str:
    ceiling = record.get("mia_epsilon_ceiling")
    return "" if ceiling is None else f"{ceiling:.3f}"


@hydra_entry("mia")
def hydra_main(cfg: DictConfig) -> None:
    def work(spec: RunSpec, run_dir: Path) -> dict[str, Any]:
        results = run_dir / RESULTS_NAME
        if spec.trainer.resume and results.exists():  # a sweep rerun skips finished cells
            record = completed_record(spec, results)
            if record is not None:
                return record
        multirun = HydraConfig.get().mode == RunMode.MULTIRUN
        return mia_run(spec, run_dir, Path(HydraConfig.get().sweep.dir).name if multirun
                       else None)

    record = run_locked("dpbench-mia", cfg, check_mia_folder, work)
    print(HEADER)
    print(table_row(record))
    for line in mia_messages(record):
        print(line, file=sys.stderr)


def main() -> None:
    """Console script ``dpbench-mia`` (and ``python -m dpbench.audit.mia``). Ctrl-C or a
    scheduler's signal stops it in one line with ``dpbench``'s preemption code (3): its
    record is written only once every model is trained, so a rerun starts the cell afresh."""
    import sys

    from dpbench.runners.stopping import PREEMPTED_EXIT_CODE, Stopped, stop_on_signals

    check_command_line("mia", "dpbench-mia", __name__)
    try:
        with stop_on_signals():
            hydra_main()
    except Stopped as stop:
        print(f"dpbench-mia: preempted by {stop.name} before its record was written; run "
              "the same command again (with trainer.resume=true a sweep skips finished "
              "cells)", file=sys.stderr, flush=True)
        sys.exit(PREEMPTED_EXIT_CODE)


if __name__ == "__main__":
    main()
