"""What a membership score achieves: ROC, AUC, TPR at low FPR, balanced accuracy, epsilon.

Intervals: AUC, TPR at a fixed FPR and balanced accuracy by a stratified percentile bootstrap
over the examples (members and non-members resampled apart); the empirical epsilon by
Clopper-Pearson bounds on TPR and FPR at a threshold chosen on a held-out half.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats
from sklearn.metrics import roc_auc_score, roc_curve

#: the false-positive rates at which the true-positive rate is reported, by field name
#: (no dot in a name: records are looked up by dotted keys)
FPR_POINTS = {"tpr_at_0p1pct_fpr": 0.001, "tpr_at_1pct_fpr": 0.01}


def roc(scores: np.ndarray, members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (fpr, tpr) of every threshold (``sklearn.metrics.roc_curve``, all points)."""
    fpr, tpr, _ = roc_curve(np.asarray(members, bool), scores, drop_intermediate=False)
    return fpr, tpr


def tpr_at_fpr(fpr: np.ndarray, tpr: np.ndarray, target: float) -> float:
    """Return the largest TPR of a threshold whose FPR is at most ``target`` (Carlini et al.
    2022, Sec. III-B: TPR at low FPR, read off the ROC without interpolation)."""
    ok = fpr <= target
    return float(tpr[ok].max()) if ok.any() else 0.0


def balanced_accuracy(fpr: np.ndarray, tpr: np.ndarray) -> float:
    """Return the best membership accuracy on a balanced prior, max_t (TPR + 1 - FPR) / 2."""
    return float(np.max((tpr + 1.0 - fpr) / 2.0))


def epsilon_from_rates(tpr: float, fpr: float, delta: float) -> float:
    """Return the epsilon a test with (TPR, FPR) proves (Kairouz et al. 2015, Thm 2.1;
    Nasr et al. 2021, Eq. 1): (epsilon, delta)-DP implies TPR <= e^eps FPR + delta and
    1 - FPR <= e^eps (1 - TPR) + delta, so

    epsilon >= max(log((TPR - delta) / FPR), log((1 - FPR - delta) / (1 - TPR)), 0).
    """
    bounds = [0.0]
    if tpr - delta > 0:
        bounds.append(math.inf if fpr <= 0 else math.log((tpr - delta) / fpr))
    if 1 - fpr - delta > 0:
        bounds.append(math.inf if tpr >= 1 else math.log((1 - fpr - delta) / (1 - tpr)))
    return max(bounds)


def clopper_pearson(k: int, n: int, confidence: float) -> tuple[float, float]:
    """Return the two-sided exact binomial interval of k successes in n
    (``scipy.stats.binomtest(...).proportion_ci(method="exact")``)."""
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence, method="exact")
    return float(ci.low), float(ci.high)


def clopper_pearson_bounds(k: np.ndarray, n: int, confidence: float
                           ) -> tuple[np.ndarray, np.ndarray]:
    """Return ``clopper_pearson`` for an array of counts at once (its beta quantiles:
    low = B^-1(alpha/2; k, n-k+1), high = B^-1(1-alpha/2; k+1, n-k), alpha = 1-confidence)."""
    k = np.asarray(k, np.float64)
    alpha = 1.0 - confidence
    with np.errstate(invalid="ignore", divide="ignore"):
        low = np.where(k > 0, stats.beta.ppf(alpha / 2, k, n - k + 1), 0.0)
        high = np.where(k < n, stats.beta.ppf(1 - alpha / 2, k + 1, n - k), 1.0)
    return low, high


def epsilon_from_rate_arrays(tpr: np.ndarray, fpr: np.ndarray, delta: float) -> np.ndarray:
    """Return ``epsilon_from_rates`` element-wise (the same two inequalities, vectorised)."""
    tpr, fpr = np.asarray(tpr, np.float64), np.asarray(fpr, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        one = np.where(tpr - delta > 0, np.log(np.maximum(tpr - delta, 1e-300))
                       - np.log(fpr), -np.inf)
        two = np.where(1 - fpr - delta > 0, np.log(np.maximum(1 - fpr - delta, 1e-300))
                       - np.log(1 - tpr), -np.inf)
    one, two = np.where(np.isnan(one), -np.inf, one), np.where(np.isnan(two), -np.inf, two)
    return np.maximum(np.maximum(one, two), 0.0)


def _threshold_bounds(scores: np.ndarray, members: np.ndarray, thresholds: np.ndarray,
                      delta: float, confidence: float) -> tuple[np.ndarray, np.ndarray,
                                                                np.ndarray, np.ndarray]:
    """Return (epsilon lower, point epsilon, TPR, FPR) of "member iff score >= t", per t."""
    order = np.sort(scores[members]), np.sort(scores[~members])
    n_in, n_out = len(order[0]), len(order[1])
    tp = n_in - np.searchsorted(order[0], thresholds, side="left")
    fp = n_out - np.searchsorted(order[1], thresholds, side="left")
    tpr_low, _ = clopper_pearson_bounds(tp, n_in, confidence)
    _, fpr_high = clopper_pearson_bounds(fp, n_out, confidence)
    lower = epsilon_from_rate_arrays(tpr_low, fpr_high, delta)
    point = epsilon_from_rate_arrays(tp / n_in, fp / n_out, delta)
    return lower, point, tp / n_in, fp / n_out


def perfect_attack_bound(n_in: int, n_out: int, delta: float, confidence: float) -> float:
    """Return the ceiling of ``empirical_epsilon``: the bound of a perfect attack (every member
    above every non-member) evaluated on ``n_in`` members and ``n_out`` non-members.

    Its TPR is 1 and FPR 0, so the bound is epsilon_from_rates of their Clopper-Pearson ends,
    (alpha/2)^(1/n_in) and 1 - (alpha/2)^(1/n_out): about 4.2 for 250 + 250 evaluated
    examples (a pool of 1000). No attack, however strong, reports more at this size.
    """
    tpr_low, _ = clopper_pearson_bounds(np.array([n_in]), n_in, confidence)
    _, fpr_high = clopper_pearson_bounds(np.array([0]), n_out, confidence)
    return float(epsilon_from_rate_arrays(tpr_low, fpr_high, delta)[0])


def empirical_epsilon(scores: np.ndarray, members: np.ndarray, delta: float,
                      confidence: float, rng: np.random.Generator) -> dict[str, Any]:
    """Return the epsilon lower bound of the attack at ``confidence``, and its ceiling.

    The examples are split in two halves by ``rng``; the threshold with the largest bound on
    the first half is evaluated on the second, where TPR's lower and FPR's upper
    Clopper-Pearson bounds (each two-sided at ``confidence``, so jointly at least
    ``confidence``) enter ``epsilon_from_rates`` (Jagielski et al. 2020, Sec. 3). Each
    example's membership counts as one trial, as in one-run auditing (Steinke et al. 2023).

    When no threshold gives a positive bound on the first half there is nothing to evaluate:
    epsilon_lower is 0 and ``threshold``, ``epsilon_point``, ``tpr`` and ``fpr`` are None.
    ``ceiling`` is ``perfect_attack_bound`` at the evaluated half's sizes.
    """
    scores, members = np.asarray(scores, np.float64), np.asarray(members, bool)
    half = rng.permutation(len(scores)) < len(scores) // 2
    sel_s, sel_m, ev_s, ev_m = scores[half], members[half], scores[~half], members[~half]
    if not (sel_m.any() and (~sel_m).any() and ev_m.any() and (~ev_m).any()):
        raise ValueError("the empirical epsilon needs members and non-members in both halves")
    ceiling = perfect_attack_bound(int(ev_m.sum()), int((~ev_m).sum()), delta, confidence)
    candidates = np.unique(sel_s)
    bounds = _threshold_bounds(sel_s, sel_m, candidates, delta, confidence)[0]
    out: dict[str, Any] = {"epsilon_lower": 0.0, "epsilon_point": None, "tpr": None,
                           "fpr": None, "threshold": None, "evaluated": int(len(ev_s)),
                           "ceiling": ceiling}
    if not bounds.max() > 0:
        return out
    threshold = float(candidates[int(np.argmax(bounds))])
    low, point, tpr, fpr = (float(v[0]) for v in _threshold_bounds(
        ev_s, ev_m, np.array([threshold]), delta, confidence))
    return {**out, "epsilon_lower": low, "epsilon_point": point, "tpr": tpr, "fpr": fpr,
            "threshold": threshold}


def _curve_metrics(fpr: np.ndarray, tpr: np.ndarray) -> dict[str, float]:
    """Return balanced accuracy and TPR at each of ``FPR_POINTS`` from one ROC curve."""
    out = {"balanced_accuracy": balanced_accuracy(fpr, tpr)}
    out.update({name: tpr_at_fpr(fpr, tpr, p) for name, p in FPR_POINTS.items()})
    return out


def point_metrics(scores: np.ndarray, members: np.ndarray) -> dict[str, float]:
    """Return AUC, balanced accuracy and TPR at each of ``FPR_POINTS``."""
    members = np.asarray(members, bool)
    return {"auc": float(roc_auc_score(members, scores)), **_curve_metrics(*roc(scores, members))}


def members_first_auc(scores: np.ndarray, n_pos: int) -> np.ndarray:
    """Return the AUC of each row of ``scores`` (reps, n) whose first ``n_pos`` columns are
    the members: the Mann-Whitney U identity AUC = (R_pos - n_pos (n_pos + 1) / 2) /
    (n_pos n_neg), R_pos the members' rank sum with tied scores at their average rank
    (``scipy.stats.rankdata``), which counts a tie as 1/2 like ``roc_auc_score``."""
    scores = np.atleast_2d(np.asarray(scores, np.float64))
    n_neg = scores.shape[1] - n_pos
    rank_sum = stats.rankdata(scores, axis=1)[:, :n_pos].sum(axis=1)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


#: bootstrap replicates ranked at once (bounds the (reps, n) score matrix)
_AUC_CHUNK_ELEMENTS = 4_000_000


def bootstrap_intervals(scores: np.ndarray, members: np.ndarray, reps: int,
                        confidence: float, rng: np.random.Generator
                        ) -> dict[str, tuple[float, float]]:
    """Return the percentile bootstrap interval of every ``point_metrics`` value.

    Members and non-members are resampled apart (stratified), so each replicate keeps the
    class sizes. Every replicate lists its members first, so the AUCs of all replicates are
    ranked at once (``members_first_auc``; equal to ``roc_auc_score`` to rounding); the
    other metrics read each replicate's ROC curve.
    """
    scores, members = np.asarray(scores, np.float64), np.asarray(members, bool)
    inside, outside = np.flatnonzero(members), np.flatnonzero(~members)
    labels = np.concatenate([np.ones(len(inside), bool), np.zeros(len(outside), bool)])
    draws: dict[str, list[float]] = {"auc": []}
    picks = []
    for _ in range(reps):
        idx = np.concatenate([rng.choice(inside, len(inside)), rng.choice(outside, len(outside))])
        picks.append(idx)
        for key, value in _curve_metrics(*roc(scores[idx], labels)).items():
            draws.setdefault(key, []).append(value)
    chunk = max(1, _AUC_CHUNK_ELEMENTS // max(len(scores), 1))
    for start in range(0, reps, chunk):
        draws["auc"].extend(members_first_auc(scores[np.stack(picks[start:start + chunk])],
                                              len(inside)).tolist())
    tail = 100 * (1 - confidence) / 2
    return {key: (float(np.percentile(v, tail)), float(np.percentile(v, 100 - tail)))
            for key, v in draws.items()}


def attack_metrics(scores: np.ndarray, members: np.ndarray, *, delta: float,
                   confidence: float, reps: int, rng: np.random.Generator) -> dict[str, Any]:
    """Return the point metrics, their ``<name>_low`` / ``<name>_high`` bootstrap bounds and
    the empirical epsilon (``epsilon_from_rates`` at a held-out threshold)."""
    out: dict[str, Any] = point_metrics(scores, members)
    for key, (low, high) in bootstrap_intervals(scores, members, reps, confidence,
                                                rng).items():
        out[f"{key}_low"], out[f"{key}_high"] = low, high
    out["epsilon"] = empirical_epsilon(scores, members, delta, confidence, rng)
    return out
