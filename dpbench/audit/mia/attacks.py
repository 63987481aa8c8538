"""Membership scores from per-example model outputs; a higher score means "member".

Inputs are per-example log-probabilities of the true label, ``log p_y = log f(x)_y``, of the
target model (shape ``(n,)``) and of R reference models (``(R, n)``) with their membership
mask ``in_refs`` (``(R, n)``, True where the example trained that reference model).
"""

from __future__ import annotations

import numpy as np
from scipy import stats
from scipy.special import logsumexp

#: the attacks ``mia.attacks`` may name
ATTACKS = ("loss", "lira_offline", "lira_online", "rmia")


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


def gaussian_fit(values: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, float]:
    """Return (per-example mean over the masked reference values, NaN where none; one pooled
    standard deviation of the values about their example's mean).

    The pooled ("global") variance is Carlini et al.'s choice for few shadow models
    (2022, Sec. VI-A); it is pooled over examples with at least two values. Raises
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
    return mean, float(np.sqrt(sq[count >= 2].sum() / dof))


def _fill_missing(mean: np.ndarray, other: np.ndarray, shift: float) -> np.ndarray:
    """Return ``mean`` with NaNs replaced by ``other + shift`` (an example with no IN or no
    OUT reference model gets the other side's mean moved by the average IN - OUT gap)."""
    return np.where(np.isnan(mean), other + shift, mean)


def _in_out_fits(phi_refs: np.ndarray, in_refs: np.ndarray
                 ) -> tuple[np.ndarray, float, np.ndarray, float]:
    mu_in, sd_in = gaussian_fit(phi_refs, in_refs)
    mu_out, sd_out = gaussian_fit(phi_refs, ~np.asarray(in_refs, bool))
    both = ~np.isnan(mu_in) & ~np.isnan(mu_out)
    if not both.any():
        raise ValueError("LiRA needs examples with both IN and OUT reference models")
    gap = float(np.mean(mu_in[both] - mu_out[both]))
    return _fill_missing(mu_in, mu_out, gap), sd_in, _fill_missing(mu_out, mu_in, -gap), sd_out


def lira_online(phi_target: np.ndarray, phi_refs: np.ndarray, in_refs: np.ndarray
                ) -> np.ndarray:
    """LiRA online (Carlini et al. 2022, Alg. 1): the log likelihood ratio

    Lambda = log N(phi; mu_in, sigma_in^2) - log N(phi; mu_out, sigma_out^2),

    with phi the target's logit-scaled confidence and the Gaussians fitted per example on the
    reference models that did (IN) and did not (OUT) train on it (pooled variances).
    """
    mu_in, sd_in, mu_out, sd_out = _in_out_fits(phi_refs, in_refs)
    phi = np.asarray(phi_target, np.float64)
    return stats.norm.logpdf(phi, mu_in, sd_in) - stats.norm.logpdf(phi, mu_out, sd_out)


def lira_offline(phi_target: np.ndarray, phi_refs: np.ndarray, in_refs: np.ndarray
                 ) -> np.ndarray:
    """LiRA offline (Carlini et al. 2022, Alg. 1, offline line): the one-sided test

    Lambda = 1 - Pr[Z > phi],  Z ~ N(mu_out, sigma_out^2),

    returned as ``-log Pr[Z > phi]`` (monotone in Lambda, no saturation at 1). Only OUT
    reference values fit the Gaussian; an example with no OUT reference takes its IN mean
    moved by the average OUT - IN gap.
    """
    _, _, mu_out, sd_out = _in_out_fits(phi_refs, in_refs)
    return -stats.norm.logsf(np.asarray(phi_target, np.float64), mu_out, sd_out)


def rmia_reference_probability(p_refs: np.ndarray, in_refs: np.ndarray, a: float
                               ) -> np.ndarray:
    """Return Pr(x) from OUT reference models (Zarifzadeh et al. 2024, Sec. 4, offline):

    Pr(x) = 1/2 ((1 + a) Pr_OUT(x) + (1 - a)),

    Pr_OUT(x) the mean of p_y over the references that did not train on x; an example every
    reference trained on takes the mean over all of them (then an IN-only estimate).
    """
    p_refs, out = np.asarray(p_refs, np.float64), ~np.asarray(in_refs, bool)
    count = out.sum(axis=0)
    mean_out = np.where(out, p_refs, 0.0).sum(axis=0) / np.maximum(count, 1)
    return np.where(count > 0, 0.5 * ((1 + a) * mean_out + (1 - a)), p_refs.mean(axis=0))


def rmia(p_target_x: np.ndarray, p_refs_x: np.ndarray, in_refs_x: np.ndarray,
         p_target_z: np.ndarray, p_refs_z: np.ndarray, a: float = 0.3,
         gamma: float = 1.0) -> np.ndarray:
    """RMIA (Zarifzadeh et al. 2024, Sec. 3): the share of population samples z dominated by x,

    Score(x; theta) = Pr_z[ LR_theta(x, z) >= gamma ],
    LR_theta(x, z) = (Pr(x | theta) / Pr(x)) / (Pr(z | theta) / Pr(z)),

    with Pr(. | theta) the target's probability of the true label, Pr(x) from the OUT
    references (``rmia_reference_probability``) and Pr(z) the mean over every reference
    (population samples z train none). Counted with one sort: O((n + m) log m).
    """
    ratio_x = np.asarray(p_target_x, np.float64) / rmia_reference_probability(
        p_refs_x, in_refs_x, a)
    ratio_z = np.asarray(p_target_z, np.float64) / np.asarray(p_refs_z, np.float64).mean(0)
    # LR >= gamma  <=>  ratio_z <= ratio_x / gamma
    return np.searchsorted(np.sort(ratio_z), ratio_x / gamma, side="right") / len(ratio_z)


__all__ = ["ATTACKS", "gaussian_fit", "lira_offline", "lira_online", "logit_confidence",
           "loss_score", "rmia", "rmia_reference_probability"]
