"""Confidence intervals and verdicts for tables over seeds (docs/tuning-and-claims.md).

Every number dpbench prints for a cell is a mean over seeds with a Student-t interval; a
comparison with a baseline pairs the runs that share a seed and reports the t-interval of
the paired differences. The quantiles come from ``scipy.stats.t``; nothing here is tuned.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

#: metrics for which a smaller value is better (the verdict flips its sign for them)
LOWER_IS_BETTER = frozenset({"ece", "nll", "brier", "mse", "rmse", "mae", "mape", "crps",
                             "crps_normalized", "js", "acf_distance", "loss", "test_loss",
                             "perplexity", "demographic_parity_gap", "accuracy_parity",
                             "group_accuracy_parity", "accuracy_parity_gap", "epsilon",
                             "total_epsilon", "wall_time_s"})


@dataclass(frozen=True)
class Interval:
    """A mean with its two-sided t confidence interval over ``n`` values."""

    mean: float
    low: float
    high: float
    n: int
    level: float = 0.95

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def format(self, digits: int = 4) -> str:
        """``mean ± half-width (n=k)``; a single value has no interval."""
        if self.n == 0 or math.isnan(self.mean):
            return "n/a"
        if self.n == 1:
            return f"{self.mean:.{digits}f} (n=1)"
        return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f} (n={self.n})"


def t_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """Return mean and the t interval mean ± t_{(1+level)/2, n-1} s / sqrt(n).

    Non-finite values are dropped first (a diverged run is reported as failed elsewhere).
    With n = 1 the interval is the point itself and is marked by n; with n = 0 it is NaN.
    """
    x = _finite(values)
    n = len(x)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, level)
    mean = float(x.mean())
    if n == 1:
        return Interval(mean, mean, mean, 1, level)
    sem = float(x.std(ddof=1)) / math.sqrt(n)
    half = float(stats.t.ppf((1 + level) / 2, df=n - 1)) * sem
    return Interval(mean, mean - half, mean + half, n, level)


def paired_difference(method: Mapping[int, float], baseline: Mapping[int, float],
                      level: float = 0.95) -> Interval:
    """Return the t interval of method - baseline over the seeds both have (paired by seed)."""
    seeds = sorted(set(method) & set(baseline))
    diffs = [method[s] - baseline[s] for s in seeds
             if method[s] is not None and baseline[s] is not None
             and np.isfinite(method[s]) and np.isfinite(baseline[s])]
    return t_interval(diffs, level)


def verdict(diff: Interval, higher_is_better: bool = True) -> str:
    """Return ``better``, ``worse`` or ``tie`` from a difference interval (``n/a`` if n < 2).

    Better means the whole interval lies on the good side of 0, worse the bad side; an
    interval that contains 0 is a tie at this confidence level.
    """
    if diff.n < 2 or math.isnan(diff.low):
        return "n/a"
    low, high = (diff.low, diff.high) if higher_is_better else (-diff.high, -diff.low)
    if low > 0:
        return "better"
    if high < 0:
        return "worse"
    return "tie"


def higher_is_better(metric: str) -> bool:
    """Return whether a larger ``metric`` is better (by name; see LOWER_IS_BETTER)."""
    return metric.lower() not in LOWER_IS_BETTER


# --- tests behind the claims' verdicts (docs/tuning-and-claims.md, "Verdict rules") ---------

#: the level of every claim's test: a two-sided 95 % interval (one-sided 2.5 % on each side)
#: for superiority, non-inferiority and thresholds, the 90 % interval of TOST (two one-sided
#: 5 % tests) for equivalence; every claim's p-value is on this scale
ALPHA = 0.05
#: the power at which the seeds a claim needs are computed
POWER = 0.8


def one_sided_p(values: Sequence[float], null: float, alternative: str) -> float:
    """Return the one-sided t-test p-value of H0 ``mean <= null`` (alternative ``greater``)
    or H0 ``mean >= null`` (``less``); NaN with fewer than two finite values.

    ``scipy.stats.ttest_1samp``; a sample without spread (where scipy gives NaN) has p 0 or 1
    by the side its mean is on (0.5 when on ``null``).
    """
    x = _finite(values)
    if len(x) < 2:
        return math.nan
    sd = float(x.std(ddof=1))
    gap = float(x.mean()) - null
    if sd == 0.0:
        if gap == 0:
            return 0.5
        return 0.0 if (gap > 0) == (alternative == "greater") else 1.0
    return float(stats.ttest_1samp(x, null, alternative=alternative).pvalue)


def tost(values: Sequence[float], low: float, high: float) -> float:
    """Return the TOST p-value of equivalence within (low, high): the larger of the one-sided
    p-values of H0 ``mean <= low`` and H0 ``mean >= high`` (Schuirmann 1987). p <= alpha
    exactly when the (1 - 2 alpha) t interval lies inside (low, high)."""
    return max(one_sided_p(values, low, "greater"), one_sided_p(values, high, "less"))


def _finite(values: Sequence[float]) -> np.ndarray:
    return np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)


def seeds_for_power(sd: float, effect: float, alpha: float = ALPHA / 2, power: float = POWER,
                    max_n: int = 1000) -> int | None:
    """Return the smallest n whose one-sided paired t test at ``alpha`` detects a true mean
    ``effect`` with probability ``power`` when the differences have standard deviation ``sd``
    (noncentral t, exact); None beyond ``max_n`` or when there is nothing to detect."""
    if not (sd > 0 and effect > 0 and math.isfinite(sd) and math.isfinite(effect)):
        return None if not (sd == 0 and effect > 0) else 2
    for n in range(2, max_n + 1):
        crit = stats.t.ppf(1 - alpha, df=n - 1)
        if stats.nct.sf(crit, df=n - 1, nc=effect * math.sqrt(n) / sd) >= power:
            return n
    return None


def seeds_for_tost(sd: float, margin: float, alpha: float = ALPHA, power: float = POWER,
                   max_n: int = 1000) -> int | None:
    """Return the smallest n whose TOST at ``alpha`` shows equivalence within +-``margin`` with
    probability ``power`` when the true difference is 0 (the usual bound: power >= 1 - 2 P(a
    one-sided test misses), each side a noncentral t); None beyond ``max_n``."""
    if not (sd > 0 and margin > 0 and math.isfinite(sd)):
        return None if not (sd == 0 and margin > 0) else 2
    for n in range(2, max_n + 1):
        crit = stats.t.ppf(1 - alpha, df=n - 1)
        miss = stats.nct.cdf(crit, df=n - 1, nc=margin * math.sqrt(n) / sd)
        if 1 - 2 * miss >= power:
            return n
    return None


def holm(pvalues: Sequence[float]) -> list[float]:
    """Return Holm's step-down adjusted p-values (Holm 1979), in the input order; NaN stays
    NaN and is not counted in the family."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(len(p), math.nan)
    idx = np.flatnonzero(~np.isnan(p))
    order = idx[np.argsort(p[idx], kind="stable")]
    m, running = len(order), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()


def benjamini_hochberg(pvalues: Sequence[float]) -> list[float]:
    """Return Benjamini-Hochberg q-values (``scipy.stats.false_discovery_control``), in the
    input order; NaN stays NaN and is not counted."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(len(p), math.nan)
    ok = ~np.isnan(p)
    if ok.any():
        out[ok] = stats.false_discovery_control(p[ok], method="bh")
    return out.tolist()


def probability_of_improvement(gains: Sequence[float]) -> float:
    """Return the share of seeds whose gain is positive, a tie counting one half (the
    probability that the method beats the baseline on a new seed, estimated over seeds)."""
    x = _finite(gains)
    if len(x) == 0:
        return math.nan
    return float((np.sum(x > 0) + 0.5 * np.sum(x == 0)) / len(x))
