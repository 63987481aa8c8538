"""Score every target with every attack, its references being all the run's other models."""

from __future__ import annotations

from typing import Any

import numpy as np

from dpbench.audit.mia.attacks import (
    UndefinedScore,
    augmented,
    choose_rmia_a,
    lira_offline,
    lira_online,
    loss_score,
    rmia,
)
from dpbench.audit.mia.metrics import attack_metrics, roc
from dpbench.audit.mia.models import ModelOutputs
from dpbench.audit.mia.settings import MIASettings
from dpbench.audit.mia.users import user_labels, user_scores
from dpbench.errors import TrainingDiverged
from dpbench.utils.seeding import stream_seed


def rmia_a(out: ModelOutputs, target: int, settings: MIASettings) -> float:
    """Return RMIA's ``a`` for ``target``: the setting, or (auto) chosen on its reference
    models alone (``choose_rmia_a``)."""
    if settings.rmia_a != "auto":
        return float(settings.rmia_a)
    refs = np.arange(len(out.members)) != target
    try:
        return choose_rmia_a(out.log_p_pool[refs], out.members[refs],
                             out.log_p_population[refs], settings.rmia_gamma)
    except UndefinedScore as err:
        raise TrainingDiverged(f"dpbench-mia: choosing RMIA's a for target {target}: {err}"
                               ) from None


def target_scores(out: ModelOutputs, target: int, attack: str, settings: MIASettings,
                  a: float | None = None) -> np.ndarray:
    """Return the scores of ``attack`` on the pool for model ``target`` (leave-one-out);
    ``a`` is RMIA's (``rmia_a`` when None)."""
    refs = np.arange(len(out.members)) != target
    in_refs = out.members[refs]
    wide = settings.lira_per_example
    if attack == "loss":
        return loss_score(out.log_p_pool[target])
    if attack.startswith("lira"):
        score = lira_online if attack == "lira_online" else lira_offline
        if out.phi_pool_augmented is not None:  # mia.lira_augment
            aug = out.phi_pool_augmented
            return augmented(score, aug[target], aug[refs], in_refs, wide)
        return score(out.phi_pool[target], out.phi_pool[refs], in_refs, wide)
    if attack == "rmia":
        p_x, p_z = out.log_p_pool, out.log_p_population  # log space: no underflow
        a = rmia_a(out, target, settings) if a is None else a
        try:
            return rmia(p_x[target], p_x[refs], in_refs, p_z[target], p_z[refs], a,
                        settings.rmia_gamma, settings.rmia_tie_break)
        except UndefinedScore as err:
            raise TrainingDiverged(f"dpbench-mia: target {target}: {err}") from None
    raise ValueError(f"unknown attack {attack!r}")


def target_members(out: ModelOutputs, targets: int, users: np.ndarray | None = None
                   ) -> np.ndarray:
    """Return the targets' membership labels, target 0 first: per pool example, or with
    ``users`` per user (every record of a user shares its label: ``users.user_labels``)."""
    return np.concatenate([out.members[t] if users is None else user_labels(out.members[t], users)
                           for t in range(targets)])


def require_finite(attack: str, scores: np.ndarray) -> None:
    """Raise TrainingDiverged in one line if ``attack`` scored a NaN or an infinity (a
    diverged model's outputs): the metrics rank scores, and a NaN has no rank."""
    bad = int((~np.isfinite(scores)).sum())
    if bad:
        raise TrainingDiverged(f"dpbench-mia: attack {attack} gave {bad} non-finite score(s) "
                               f"of {len(scores)} (NaN or infinite model outputs: a model "
                               "diverged; lower the learning rate or raise the noise)")


def score_attacks(out: ModelOutputs, settings: MIASettings, delta: float,
                  users: np.ndarray | None = None
                  ) -> tuple[dict[str, dict[str, Any]], dict[str, tuple[np.ndarray, np.ndarray]],
                             dict[str, np.ndarray]]:
    """Return ({attack: metrics}, {attack: (fpr, tpr)}, {attack: scores}) over the targets'
    pooled examples (scores: target 0's pool, then target 1's, ...); with ``users`` (each
    pool record's user, ``privacy.unit=user``) over the targets' users instead, each user
    scored from its records (``users.user_scores``).

    The targets' (score, member) pairs are pooled (Carlini et al. 2022 pool over targets);
    the bootstrap and the threshold halves draw from stream ``mia_metrics``.
    """
    members = target_members(out, settings.targets, users)
    results, curves, all_scores = {}, {}, {}
    for i, attack in enumerate(settings.attacks):
        chosen = ([rmia_a(out, t, settings) for t in range(settings.targets)]
                  if attack == "rmia" else [None] * settings.targets)
        per_target = [target_scores(out, t, attack, settings, chosen[t])
                      for t in range(settings.targets)]
        scores = np.concatenate(per_target if users is None else
                                [user_scores(attack, s, users) for s in per_target])
        require_finite(attack, scores)
        rng = np.random.default_rng(stream_seed(settings.seed, "mia_metrics", i))
        results[attack] = attack_metrics(scores, members, delta=delta,
                                         confidence=settings.confidence,
                                         reps=settings.bootstrap, rng=rng)
        if attack == "rmia":
            results[attack]["a"] = chosen  # per target
        if attack.startswith("lira"):
            results[attack]["variance"] = ("per_example" if settings.lira_per_example
                                           else "global")
            results[attack]["augmentations"] = (1 if out.phi_pool_augmented is None
                                                else int(out.phi_pool_augmented.shape[1]))
        curves[attack] = roc(scores, members)
        all_scores[attack] = scores
    return results, curves, all_scores
