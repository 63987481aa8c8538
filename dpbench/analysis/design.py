"""The claims' planned two-stage design (docs/tuning-and-claims.md, "The design").

A paper's claims are decided in at most two looks, declared before the first:

- **Stage 1, the pilot** (``PILOT_SEEDS`` seeds a cell by default): every elementary one-sided
  test (a claim's cell, a null value, a direction) gives its p-value q1 on the pilot's seeds,
  and may decide at the level ``PILOT_SHARE`` x alpha.
- **Stage 2, the follow-up**, sized from the pilot by the hint (``follow_up_seeds``): only
  the new seeds give q2, and the stages are combined by the inverse-normal combination test
  (Bauer & Koehne 1994; Lehmacher & Wassmer 1999, eq. 2), with weights fixed in advance
  (``STAGE1_WEIGHT``):

      z = w1 Phi^-1(1 - q1) + w2 Phi^-1(1 - q2),   w1^2 + w2^2 = 1,   qc = 1 - Phi(z),

  which is uniform under H0 whatever rule chose the follow-up's size from stage 1 (q2 is
  independent of stage 1 given its size). It may decide at (1 - PILOT_SHARE) x alpha.

The design's one-sided p-value is ``min(q1 / PILOT_SHARE, qc / (1 - PILOT_SHARE))``: by
Bonferroni over the two looks, P(it is <= a) <= a under H0 at every level a, so it enters
Holm within a paper like any p-value, and a pilot that decided stands (the minimum only falls).
Futility stopping is non-binding: a claim whose follow-up is out of reach is not followed up,
which cannot raise an error rate.

The hint is an assurance (O'Hagan, Stevens & Campbell 2005): the power of the follow-up's
test averaged over what the pilot says about each cell's standard deviation (sigma^2 ~
(n - 1) s^2 / chi^2_{n - 1}, the posterior under the reference prior), rather than the power
at one upper bound on it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from dpbench.analysis.stats import ALPHA, POWER

#: the seeds a cell gets in the pilot (stage 1) of ``dpbench-reproduce --until-decided``
PILOT_SEEDS = 5
#: the share of each one-sided test's alpha the pilot may spend (the rest is the follow-up's)
PILOT_SHARE = 0.1
#: the inverse-normal weight of stage 1, fixed before any look (w1^2 = 0.2: a pilot of 5
#: seeds against an expected total of about 25; a mismatch costs little power)
STAGE1_WEIGHT = math.sqrt(0.2)
#: the most seeds a cell's follow-up is ever sized to
MAX_FOLLOW_UP = 1000
#: the quadrature points over the standard deviation's posterior
QUADRATURE = 24


@dataclass(frozen=True)
class Stages:
    """The seeds of each stage: ``pilot`` (stage 1) and ``follow_up`` (stage 2, empty before
    it is launched). ``None`` as a claim's design means one fixed look at the full alpha."""

    pilot: tuple[int, ...]
    follow_up: tuple[int, ...] = ()

    def stage_of(self, seed: int) -> int | None:
        """Return 1 or 2, or None for a seed outside the design."""
        if seed in self.pilot:
            return 1
        return 2 if seed in self.follow_up else None

    @property
    def seeds(self) -> tuple[int, ...]:
        return tuple(self.pilot) + tuple(self.follow_up)


def combine(q1: np.ndarray | float, q2: np.ndarray | float,
            w1: float = STAGE1_WEIGHT) -> np.ndarray:
    """Return the inverse-normal combination of two independent one-sided p-values (NaN
    where either is NaN)."""
    w2 = math.sqrt(1 - w1 ** 2)
    q1, q2 = (np.clip(np.asarray(q, dtype=float), 1e-300, 1.0) for q in (q1, q2))
    return stats.norm.sf(w1 * stats.norm.isf(q1) + w2 * stats.norm.isf(q2))


def design_p(q1: np.ndarray | float, q2: np.ndarray | float | None = None,
             share: float = PILOT_SHARE, w1: float = STAGE1_WEIGHT) -> np.ndarray:
    """Return the design's one-sided p-value: min(q1 / share, qc / (1 - share)), qc the
    combination with stage 2 (absent or NaN: the pilot's look alone)."""
    q1 = np.asarray(q1, dtype=float)
    out = np.minimum(1.0, q1 / share)
    if q2 is None:
        return out
    qc = combine(q1, q2, w1) / (1 - share)
    return np.where(np.isnan(qc), out, np.fmin(out, np.minimum(1.0, qc)))


def _sd_draws(sd: float, n: int, points: int = QUADRATURE) -> np.ndarray:
    """Return ``points`` equally weighted standard deviations from the posterior
    sigma^2 = (n - 1) s^2 / chi^2_{n - 1} (mid-quantiles of the chi-square)."""
    u = (np.arange(points) + 0.5) / points
    return sd * np.sqrt((n - 1) / stats.chi2.ppf(u, n - 1))


def t_test_power(effect: float | np.ndarray, sigma: np.ndarray, n: np.ndarray,
                 level: np.ndarray | float, tost: bool = False) -> np.ndarray:
    """Return the power of the one-sided t test at one-sided ``level`` on ``n`` values when
    the true mean lies ``effect`` beyond the null (noncentral t, broadcast over the
    arguments); with ``tost`` the TOST bound 1 - 2 P(one side misses)."""
    n = np.asarray(n, dtype=float)
    crit = stats.t.isf(np.clip(level, 1e-300, 1 - 1e-16), n - 1)
    power = stats.nct.sf(crit, n - 1, np.asarray(effect) * np.sqrt(n) / sigma)
    return np.clip(1 - 2 * (1 - power), 0, 1) if tost else power


def assurance(effect: float, sds: Sequence[float], pilot_n: Sequence[int] | int,
              n: np.ndarray | int, level: np.ndarray | float, tost: bool = False) -> np.ndarray:
    """Return the assurance of every cell's test at once (product over the cells of each
    cell's power averaged over its standard deviation's posterior) with ``n`` values a cell
    at one-sided ``level`` (an array: one level per cell, the follow-up's conditional
    levels)."""
    n = np.asarray(n)
    pilot = np.broadcast_to(np.asarray(pilot_n), (len(sds),))
    levels = np.broadcast_to(np.asarray(level, dtype=float), (len(sds),))
    joint = np.ones(n.shape)
    for sd, k, lev in zip(sds, pilot, levels):
        if not (sd > 1e-12 * abs(effect)):     # no spread seen: this cell does not limit n
            continue
        sigma = _sd_draws(float(sd), int(k))
        joint = joint * t_test_power(effect, sigma[:, None], n[None] if n.ndim else n,
                                     lev, tost).mean(0).reshape(n.shape)
    return joint


def conditional_level(q1: float, level: float, share: float = PILOT_SHARE,
                      w1: float = STAGE1_WEIGHT) -> float:
    """Return the one-sided level stage 2's own p-value must reach for the combination to
    reject at the follow-up's share of ``level`` given the pilot's q1 (Proschan & Hunsberger
    1995: the conditional error)."""
    w2 = math.sqrt(1 - w1 ** 2)
    z1 = float(stats.norm.isf(min(max(q1, 1e-300), 1.0)))
    need = (float(stats.norm.isf((1 - share) * level)) - w1 * z1) / w2
    return float(stats.norm.sf(need))


def seeds_for_assurance(effect: float, sds: Sequence[float], pilot_n: Sequence[int] | int,
                        level: Sequence[float] | float, power: float = POWER,
                        tost: bool = False, min_n: int = 2,
                        max_n: int = MAX_FOLLOW_UP) -> int | None:
    """Return the smallest n in [min_n, max_n] whose assurance reaches ``power`` (bisection:
    the assurance grows with n), None beyond ``max_n``."""
    if not (effect > 0 and math.isfinite(effect)) or not all(math.isfinite(s) for s in sds):
        return None
    if assurance(effect, sds, pilot_n, max_n, level, tost) < power:
        return None
    lo, hi = max(2, min_n), max_n
    if assurance(effect, sds, pilot_n, lo, level, tost) >= power:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if assurance(effect, sds, pilot_n, mid, level, tost) >= power \
            else (mid, hi)
    return hi


def follow_up_seeds(effect: float, sds: Sequence[float], pilot_n: Sequence[int] | int,
                    q1: Sequence[float], family: int = 1, tost: bool = False,
                    power: float = POWER, max_n: int = MAX_FOLLOW_UP) -> int | None:
    """Return the follow-up's seeds a cell at which the claim's test for it rejects with
    assurance ``power`` when the true effect lies ``effect`` beyond its null: each cell's
    stage 2 at its conditional level given the pilot's one-sided ``q1`` (Holm's first level,
    alpha / family)."""
    level = ALPHA / 2 / max(1, family)
    levels = [conditional_level(q, level) if math.isfinite(q) else (1 - PILOT_SHARE) * level
              for q in q1]
    return seeds_for_assurance(effect, sds, pilot_n, levels, power, tost, 2, max_n)


def fixed_seeds(effect: float, sds: Sequence[float], pilot_n: Sequence[int] | int,
                family: int = 1, tost: bool = False, power: float = POWER,
                min_n: int = 2, max_n: int = MAX_FOLLOW_UP) -> int | None:
    """Return the seeds a cell of a fresh fixed design (one look at the full alpha, Holm's
    first level) needs for assurance ``power`` from a pilot's spreads."""
    return seeds_for_assurance(effect, sds, pilot_n, ALPHA / 2 / max(1, family), power, tost,
                               min_n, max_n)


def failure_interval(failed: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Return the Clopper-Pearson interval of a failure rate (``scipy.stats.binomtest``)."""
    if n <= 0:
        return math.nan, math.nan
    ci = stats.binomtest(failed, n).proportion_ci(confidence, method="exact")
    return float(ci.low), float(ci.high)
