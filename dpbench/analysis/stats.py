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
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
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
