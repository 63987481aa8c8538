"""Membership scores from per-example model outputs; a higher score means "member".

Inputs are per-example log-probabilities of the true label, ``log p_y = log f(x)_y``, of the
target model (shape ``(n,)``) and of R reference models (``(R, n)``) with their membership
mask ``in_refs`` (``(R, n)``, True where the example trained that reference model).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats
from scipy.special import logsumexp

#: the attacks ``mia.attacks`` may name
ATTACKS = ("loss", "lira_offline", "lira_online", "rmia")


class UndefinedScore(ValueError):
    """A score cannot be defined from the model outputs (NaN, or 0 / 0)."""


def logit_confidence(log_probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Return phi = log(p_y / (1 - p_y)) per example (Carlini et al. 2022, Sec. IV-B).

    Computed stably from the log-probabilities ``(n, C)`` as
    ``log p_y - logsumexp_{y' != y} log p_y'`` (the authors' implementation does the same).
    """
    log_probs = np.asarray(log_probs, dtype=np.float64)
    idx = np.arange(len(labels))
    true = log_probs[idx, labels]
    others = log_probs.copy()
    others[idx, labels] = -np.inf
    return true - logsumexp(others, axis=1)


def loss_score(log_p_target: np.ndarray) -> np.ndarray:
    """LOSS attack (Yeom et al. 2018, Sec. 3.2, Adversary 1): member iff loss(x) < tau.

    The score is minus the cross-entropy, ``-l(x) = log f(x)_y``.
    """
    return np.asarray(log_p_target, dtype=np.float64)


def gaussian_fit(values: np.ndarray, mask: np.ndarray, per_example: bool = False
                 ) -> tuple[np.ndarray, float | np.ndarray]:
    """Return (per-example mean over the masked reference values, NaN where none; the
    standard deviation of the values about their example's mean).

    The pooled ("global") variance, one number, is Carlini et al.'s choice for few shadow
    models (2022, Sec. VI-A); it is pooled over examples with at least two values. With
    ``per_example`` (their choice with many shadow models) each example with two or more
    values gets its own standard deviation, the others the pooled one (an array). Raises
    ValueError if no example has two.
    """
    values, mask = np.asarray(values, np.float64), np.asarray(mask, bool)
    count = mask.sum(axis=0)
    total = np.where(mask, values, 0.0).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    sq = np.where(mask, (values - np.nan_to_num(mean)) ** 2, 0.0).sum(axis=0)
    dof = (count - 1)[count >= 2].sum()
    if dof <= 0:
        raise ValueError("a Gaussian fit needs an example with at least two reference values")
    pooled = float(np.sqrt(sq[count >= 2].sum() / dof))
    if not per_example:
        return mean, pooled
    with np.errstate(invalid="ignore", divide="ignore"):
        own = np.sqrt(sq / np.maximum(count - 1, 1))
    # an example whose values all coincide (sd 0) also takes the pooled value
    return mean, np.where((count >= 2) & (own > 0), own, pooled)


def _fill_missing(mean: np.ndarray, other: np.ndarray, shift: float) -> np.ndarray:
    """Return ``mean`` with NaNs replaced by ``other + shift`` (an example with no IN or no
    OUT reference model gets the other side's mean moved by the average IN - OUT gap)."""
    return np.where(np.isnan(mean), other + shift, mean)


def _in_out_fits(phi_refs: np.ndarray, in_refs: np.ndarray, per_example: bool = False
                 ) -> tuple[np.ndarray, Any, np.ndarray, Any]:
    mu_in, sd_in = gaussian_fit(phi_refs, in_refs, per_example)
    mu_out, sd_out = gaussian_fit(phi_refs, ~np.asarray(in_refs, bool), per_example)
    both = ~np.isnan(mu_in) & ~np.isnan(mu_out)
    if not both.any():
        raise ValueError("LiRA needs examples with both IN and OUT reference models")
    gap = float(np.mean(mu_in[both] - mu_out[both]))
    return _fill_missing(mu_in, mu_out, gap), sd_in, _fill_missing(mu_out, mu_in, -gap), sd_out


def lira_online(phi_target: np.ndarray, phi_refs: np.ndarray, in_refs: np.ndarray,
                per_example: bool = False) -> np.ndarray:
    """LiRA online (Carlini et al. 2022, Alg. 1): the log likelihood ratio

    Lambda = log N(phi; mu_in, sigma_in^2) - log N(phi; mu_out, sigma_out^2),

    with phi the target's logit-scaled confidence and the Gaussians fitted per example on the
    reference models that did (IN) and did not (OUT) train on it (pooled variances, or
    per-example ones with ``per_example``).
    """
    mu_in, sd_in, mu_out, sd_out = _in_out_fits(phi_refs, in_refs, per_example)
    phi = np.asarray(phi_target, np.float64)
    return stats.norm.logpdf(phi, mu_in, sd_in) - stats.norm.logpdf(phi, mu_out, sd_out)


def lira_offline(phi_target: np.ndarray, phi_refs: np.ndarray, in_refs: np.ndarray,
                 per_example: bool = False) -> np.ndarray:
    """LiRA offline (Carlini et al. 2022, Alg. 1, offline line): the one-sided test

    Lambda = 1 - Pr[Z > phi],  Z ~ N(mu_out, sigma_out^2),

    returned as ``-log Pr[Z > phi]`` (monotone in Lambda, no saturation at 1). Only OUT
    reference values fit the Gaussian; an example with no OUT reference takes its IN mean
    moved by the average OUT - IN gap.
    """
    _, _, mu_out, sd_out = _in_out_fits(phi_refs, in_refs, per_example)
    return -stats.norm.logsf(np.asarray(phi_target, np.float64), mu_out, sd_out)


def rmia_log_reference_probability(log_p_refs: np.ndarray, in_refs: np.ndarray, a: float
                                   ) -> np.ndarray:
    """Return log Pr(x) from OUT reference models (Zarifzadeh et al. 2024, Sec. 4, offline):

    Pr(x) = 1/2 ((1 + a) Pr_OUT(x) + (1 - a)),

    Pr_OUT(x) the mean of p_y over the references that did not train on x; an example every
    reference trained on takes the mean over all of them (then an IN-only estimate). Computed
    from the log-probabilities ``(R, n)`` with logsumexp, so that probabilities below the
    float range (log p_y near -1900) keep their size instead of underflowing to 0.
    """
    log_p_refs, out = np.asarray(log_p_refs, np.float64), ~np.asarray(in_refs, bool)
    count = out.sum(axis=0)
    with np.errstate(divide="ignore"):
        log_mean_out = (logsumexp(np.where(out, log_p_refs, -np.inf), axis=0)
                        - np.log(np.maximum(count, 1)))
        log_mean_all = logsumexp(log_p_refs, axis=0) - np.log(len(log_p_refs))
        interpolated = np.log(0.5) + np.logaddexp(np.log1p(a) + log_mean_out, np.log(1 - a))
    return np.where(count > 0, interpolated, log_mean_all)


def augmented(score: Any, phi_target: np.ndarray, phi_refs: np.ndarray, in_refs: np.ndarray,
              per_example: bool = False) -> np.ndarray:
    """Return LiRA ``score`` averaged over query augmentations (Carlini et al. 2022,
    Sec. VI-B): ``phi_target`` (A, n) and ``phi_refs`` (R, A, n) hold each augmentation's
    values; each augmentation gets its own Gaussians, and the scores are averaged over A."""
    phi_target, phi_refs = np.asarray(phi_target), np.asarray(phi_refs)
    return np.mean([score(phi_target[a], phi_refs[:, a], in_refs, per_example)
                    for a in range(phi_target.shape[0])], axis=0)


def rmia_log_population_probability(log_p_refs_z: np.ndarray, a: float) -> np.ndarray:
    """Return log Pr(z) for population samples, which no reference trained on: the same
    offline interpolation as ``rmia_log_reference_probability``,
    1/2 ((1 + a) mean_refs p_z + (1 - a)) (Zarifzadeh et al. 2024, Sec. 4; the authors' code
    treats z like x)."""
    log_p_refs_z = np.asarray(log_p_refs_z, np.float64)
    return rmia_log_reference_probability(log_p_refs_z, np.zeros(log_p_refs_z.shape, bool), a)


def _dominated_share(log_x: np.ndarray, log_z: np.ndarray, tie_break: bool) -> np.ndarray:
    """Return the share of the ratios ``exp(log_z)`` at or below each ``exp(log_x)`` (the
    empirical CDF), from the log-ratios.

    With ``tie_break`` the CDF is interpolated linearly in the ratios (not their logs)
    between the distinct population values (from (0, 0)), so that examples between the same
    two population samples keep their order instead of sharing one of m + 1 values; it
    equals the exact share at every population value. Above the largest population value the
    order is kept by a term below 1e-9. Every interpolation weight is a quotient of ratios,
    taken relative to the upper end (``exp`` of log differences), so no ratio is ever formed.
    """
    ordered = np.sort(log_z)
    exact = np.searchsorted(ordered, log_x, side="right") / len(ordered)
    if not tie_break:
        return exact
    values, counts = np.unique(ordered, return_counts=True)
    cdf = np.cumsum(counts) / len(ordered)
    k = np.searchsorted(values, log_x, side="right")  # distinct values at or below x
    upper = np.minimum(k, len(values) - 1)
    lower_value = np.where(k > 0, values[np.maximum(k - 1, 0)], -np.inf)
    lower_cdf = np.where(k > 0, cdf[np.maximum(k - 1, 0)], 0.0)
    inside = k < len(values)  # else above the largest value: the CDF is 1
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        # (x - v_lo) / (v_up - v_lo), both ratios divided by v_up
        step = np.where(inside, -np.expm1(lower_value - values[upper]), 1.0)
        weight = (np.exp(log_x - values[upper]) - np.exp(lower_value - values[upper])) / step
        above = -1e-9 * np.expm1(values[-1] - log_x)
    smooth = np.where(inside, lower_cdf + np.where(inside, weight, 0.0)
                      * (cdf[upper] - lower_cdf), 1.0)
    return smooth + np.where(log_x > values[-1], above, 0.0)


def rmia(log_p_target_x: np.ndarray, log_p_refs_x: np.ndarray, in_refs_x: np.ndarray,
         log_p_target_z: np.ndarray, log_p_refs_z: np.ndarray, a: float = 0.3,
         gamma: float = 1.0, tie_break: bool = False) -> np.ndarray:
    """RMIA (Zarifzadeh et al. 2024, Sec. 3): the share of population samples z dominated by x,

    Score(x; theta) = Pr_z[ LR_theta(x, z) >= gamma ],
    LR_theta(x, z) = (Pr(x | theta) / Pr(x)) / (Pr(z | theta) / Pr(z)),

    with Pr(. | theta) the target's probability of the true label, Pr(x) from the OUT
    references (``rmia_log_reference_probability``) and Pr(z) from every reference, both with
    the offline (1 + a) / 2 interpolation (population samples z train none). Inputs are
    log-probabilities and the ratios are compared as log-ratios, so a model that blew up
    (log p_y near -1900, p_y 0 in float64) still gets finite scores. Counted with one
    sort: O((n + m) log m); ``tie_break`` interpolates the count (``_dominated_share``).

    Raises UndefinedScore naming the cause where a log-ratio is undefined: a NaN log-probability,
    or p_y = 0 exactly (log p_y = -inf) under the target and Pr(.) = 0 (a = 1, every OUT
    reference also -inf).
    """
    with np.errstate(invalid="ignore"):  # -inf - -inf: NaN, refused below
        log_x = np.asarray(log_p_target_x, np.float64) - rmia_log_reference_probability(
            log_p_refs_x, in_refs_x, a)
        log_z = np.asarray(log_p_target_z, np.float64) - rmia_log_population_probability(
            log_p_refs_z, a)
    for name, values in (("pool example", log_x), ("population sample", log_z)):
        bad = int(np.isnan(values).sum())
        if bad:
            raise UndefinedScore(f"RMIA's likelihood ratio is undefined on {bad} {name}(s): a "
                             "log-probability is NaN, or p_y = 0 under the target and the "
                             f"references at a={a:g} (the model diverged)")
    # LR >= gamma  <=>  log ratio_z <= log ratio_x - log gamma
    return _dominated_share(log_x - np.log(gamma), log_z, tie_break)


#: the values of ``a`` that ``choose_rmia_a`` tries
RMIA_A_GRID = tuple(round(0.1 * i, 1) for i in range(11))


def choose_rmia_a(log_p_refs_x: np.ndarray, in_refs_x: np.ndarray, log_p_refs_z: np.ndarray,
                  gamma: float = 1.0, grid: tuple[float, ...] = RMIA_A_GRID) -> float:
    """Return the ``a`` of offline RMIA that attacks the reference models best (the authors'
    procedure, Zarifzadeh et al. 2024, Sec. 4 / App. B.2: tune on a reference model).

    Each reference model in turn is the pseudo-target, the other references its references
    (the attacker trained them all and knows their halves; the real target's membership is
    never used); ``a`` maximises the mean AUC over pseudo-targets, ties to the smaller ``a``.
    Needs at least two reference models; takes log-probabilities like ``rmia``.
    """
    from sklearn.metrics import roc_auc_score

    log_p_refs_x = np.asarray(log_p_refs_x, np.float64)
    in_refs_x = np.asarray(in_refs_x, bool)
    log_p_refs_z = np.asarray(log_p_refs_z, np.float64)
    k = len(log_p_refs_x)
    if k < 2:
        raise ValueError("choosing RMIA's a needs at least two reference models")
    usable = [j for j in range(k) if in_refs_x[j].any() and (~in_refs_x[j]).any()]
    best, best_auc = grid[0], -np.inf
    for a in grid:
        aucs = []
        for j in usable:
            rest = np.arange(k) != j
            scores = rmia(log_p_refs_x[j], log_p_refs_x[rest], in_refs_x[rest],
                          log_p_refs_z[j], log_p_refs_z[rest], a, gamma, tie_break=True)
            aucs.append(roc_auc_score(in_refs_x[j], scores))
        auc = float(np.mean(aucs)) if aucs else -np.inf
        if auc > best_auc + 1e-12:
            best, best_auc = a, auc
    return float(best)


__all__ = ["ATTACKS", "UndefinedScore", "augmented", "choose_rmia_a", "gaussian_fit",
           "lira_offline", "lira_online",
           "logit_confidence", "loss_score", "rmia", "rmia_log_population_probability",
           "rmia_log_reference_probability"]
