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
                             "total_epsilon", "wall_time_s",
                             # membership inference: the attacker's success (dpbench-mia)
                             "mia_auc", "mia_tpr_at_0p1pct_fpr", "mia_tpr_at_1pct_fpr",
                             "mia_balanced_accuracy", "mia_epsilon_lower"})


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

#: the error budget of a paper's claims: a two-sided 5 %, that is one-sided 2.5 % for a false
#: "reproduced" and 2.5 % for a false "contradicted" (Holm within the paper on each side);
#: every claim's p-value is on this scale (one-sided p doubled)
ALPHA = 0.05
#: the power at which the seeds a claim needs are computed
POWER = 0.8
#: the one-sided confidence of the upper bound on the standard deviation the hints use
SD_CONFIDENCE = 0.8
#: sign-flip tests enumerate all 2^n flips up to this n, resample beyond it
EXACT_MAX_N = 13
SIGN_FLIP_DRAWS = 20000


def one_sided_p(values: Sequence[float], null: float, alternative: str, *, exact: bool = False,
                rng: np.random.Generator | None = None) -> float:
    """Return the one-sided p-value of H0 ``mean <= null`` (alternative ``greater``) or H0
    ``mean >= null`` (``less``); NaN with fewer than two finite values.

    ``scipy.stats.ttest_1samp``; the exact sign-flip test (``sign_flip_p``) when ``exact`` or
    when the sample has no spread (a t-test cannot hold there: scipy's p is NaN, and a p of 0
    would decide on two equal numbers).
    """
    x = _finite(values)
    if len(x) < 2:
        return math.nan
    if exact or no_spread(x):
        return sign_flip_p(x, null, alternative, rng)
    return float(stats.ttest_1samp(x, null, alternative=alternative).pvalue)


def sign_flip_p(values: Sequence[float], null: float, alternative: str,
                rng: np.random.Generator | None = None) -> float:
    """Return the sign-flip permutation p-value of the mean of ``values - null``
    (``scipy.stats.permutation_test``, one sample: its signs are flipped; exact, all 2^n
    flips, up to EXACT_MAX_N values). Valid when the differences are symmetric about
    ``null`` under H0 (Fisher 1935; Good 2005, ch. 3); its smallest p is 2^-n."""
    x = _finite(values) - null
    if len(x) < 1:
        return math.nan
    if not np.any(x):
        return 1.0  # every value on the null: no evidence either way
    res = stats.permutation_test((x,), np.mean, permutation_type="samples",
                                 alternative=alternative, vectorized=True,
                                 n_resamples=np.inf if len(x) <= EXACT_MAX_N
                                 else SIGN_FLIP_DRAWS,
                                 rng=rng if rng is not None else np.random.default_rng(0))
    return float(res.pvalue)


def tost(values: Sequence[float], low: float, high: float) -> float:
    """Return the TOST p-value of equivalence within (low, high): the larger of the one-sided
    p-values of H0 ``mean <= low`` and H0 ``mean >= high`` (Schuirmann 1987;
    ``statsmodels.stats.weightstats.ttost_paired`` on the paired differences). p <= alpha
    exactly when the (1 - 2 alpha) t interval lies inside (low, high); a sample without
    spread takes the sign-flip tests."""
    from statsmodels.stats.weightstats import ttost_paired

    x = _finite(values)
    if len(x) < 2:
        return math.nan
    if no_spread(x):
        return max(one_sided_p(x, low, "greater"), one_sided_p(x, high, "less"))
    return float(ttost_paired(x, np.zeros_like(x), low, high)[0])


def no_spread(values: Sequence[float]) -> bool:
    """Return whether ``values`` are equal up to rounding (a standard deviation below 1e-12
    of their size): a t statistic is then rounding noise."""
    x = _finite(values)
    return len(x) < 2 or float(x.std(ddof=1)) <= 1e-12 * max(1.0, float(np.abs(x).max()))


def _finite(values: Sequence[float]) -> np.ndarray:
    return np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)


def sd_upper_bound(sd: float, n: int, confidence: float = SD_CONFIDENCE) -> float:
    """Return the one-sided ``confidence`` upper bound on a standard deviation estimated as
    ``sd`` from ``n`` values: sd sqrt((n - 1) / chi2_{1 - confidence, n - 1}) (normal
    sample: (n - 1) s^2 / sigma^2 ~ chi2_{n - 1})."""
    if n < 2 or not math.isfinite(sd):
        return math.nan
    return sd * math.sqrt((n - 1) / float(stats.chi2.ppf(1 - confidence, n - 1)))


def t_power(effect: float, sd: float, n: np.ndarray | int, alpha: float) -> np.ndarray:
    """Return the power of the one-sided one-sample t test at level ``alpha`` when the true
    mean lies ``effect`` beyond the null (noncentral t, ``statsmodels``' ``TTestPower``)."""
    from statsmodels.stats.power import TTestPower

    return np.asarray(TTestPower().power(effect_size=effect / sd, nobs=np.asarray(n),
                                         alpha=alpha, alternative="larger"), dtype=float)


def seeds_for_power(sd: float | Sequence[float], effect: float, alpha: float = ALPHA / 2,
                    power: float = POWER, max_n: int = 1000, *, tost: bool = False,
                    min_n: int = 2) -> int | None:
    """Return the smallest n >= ``min_n`` at which every cell's one-sided t test at ``alpha``
    (one-sided) detects a true mean ``effect`` beyond its null, jointly, with probability
    ``power``: the product of the cells' noncentral-t powers (independent cells; ``sd`` one
    value per cell). With ``tost`` each cell's power is that of TOST within +-``effect`` at a
    true difference 0, bounded below by 1 - 2 P(one side misses). None beyond ``max_n``."""
    sds = np.atleast_1d(np.asarray(sd, dtype=float))
    if not (effect > 0 and math.isfinite(effect)) or not np.all(np.isfinite(sds)):
        return None
    n = np.arange(max(2, min_n), max_n + 1)
    joint = np.ones(len(n))
    for s in sds:
        if s <= 1e-12 * effect:  # no spread seen: this cell does not limit n (an exact
            continue               # test's smallest p might: exact_min_n)
        side = t_power(effect, float(s), n, alpha)
        joint *= np.clip(1 - 2 * (1 - side), 0, 1) if tost else side
    hit = np.flatnonzero(joint >= power)
    return int(n[hit[0]]) if len(hit) else None


def seeds_for_tost(sd: float, margin: float, alpha: float = ALPHA / 2, power: float = POWER,
                   max_n: int = 1000) -> int | None:
    """Return the smallest n whose TOST at ``alpha`` (each side) shows equivalence within
    +-``margin`` with probability ``power`` when the true difference is 0 (``seeds_for_power``
    with ``tost``); None beyond ``max_n``."""
    if sd == 0 and margin > 0:
        return 2
    return seeds_for_power(sd, margin, alpha, power, max_n, tost=True)


def exact_min_n(alpha: float) -> int:
    """Return the fewest values with which a one-sided sign-flip test can reach ``alpha``
    (its smallest p is 2^-n)."""
    return max(2, math.ceil(math.log2(1 / alpha) - 1e-12))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Return Holm's step-down adjusted p-values (Holm 1979; statsmodels' ``multipletests``),
    in the input order; NaN stays NaN and is not counted in the family."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(pvalues, dtype=float)
    out = np.full(len(p), math.nan)
    ok = ~np.isnan(p)
    if ok.any():
        out[ok] = multipletests(np.clip(p[ok], 0, 1), method="holm")[1]
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


def sign_flip_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Return the interval of means the two one-sided sign-flip tests at (1 - level) / 2 do not
    reject (test inversion, bisection over the null); an end is infinite when no null beyond
    the data is rejected (fewer than log2(2 / (1 - level)) values)."""
    x = _finite(values)
    if len(x) < 2:
        return math.nan, math.nan
    side = (1 - level) / 2
    lo_x, hi_x = float(x.min()), float(x.max())

    def bound(alternative: str) -> float:
        def rejects(null: float) -> bool:
            return sign_flip_p(x, null, alternative) <= side

        outer = lo_x if alternative == "greater" else hi_x   # every value on one side
        if not rejects(outer - (1e-12 if alternative == "greater" else -1e-12)):
            return -math.inf if alternative == "greater" else math.inf
        good, bad = outer, (hi_x if alternative == "greater" else lo_x)
        if rejects(bad):
            return bad
        for _ in range(50):   # good: rejected; bad: not rejected
            mid = (good + bad) / 2
            good, bad = (mid, bad) if rejects(mid) else (good, mid)
        return good

    return bound("greater"), bound("less")


#: the claims' per-stage test: the t test on Hall's skewness-removing transformation
SKEW_CORRECTED = True
#: the sample skewness enters Hall's transformation moved this many of its normal-theory
#: standard errors (sqrt(6 / n)) towards the side that makes the test conservative: the
#: sample skewness of a skewed gain is biased towards 0 and noisy at 5-100 values, and
#: Hall's correction at the plain estimate leaves a left-skewed gain's one-sided level 1.5x
#: nominal at n = 40 and alpha / 6 (measured: docs/tuning-and-claims.md, "Skewed gains")
SKEW_SHIFT = 1.0
#: the fewest values the shift is computed for (a smaller sample gets this one's shift)
SKEW_SHIFT_MIN_N = 24
#: resamples of the studentised bootstrap (steps savings and other declared-skewed cells)
BOOTSTRAP_DRAWS = 1999


def one_sided_q(x: np.ndarray, null: float, alternative: str, *, bootstrap: bool = False,
                rng: np.random.Generator | None = None, draws: int = BOOTSTRAP_DRAWS,
                skew: bool = SKEW_CORRECTED, shift: float = SKEW_SHIFT,
                floor: float = SKEW_SHIFT_MIN_N) -> np.ndarray:
    """Return one-sided p-values of H0 ``mean <= null`` (``greater``) or ``mean >= null``
    (``less``) for each row of ``x`` (..., n), vectorised over the leading axes.

    The one-sample t test (``scipy.stats.t``), with ``skew`` on Hall's transformation of the
    t statistic (Hall 1992, eq. 2.3: g(T) = T + a T^2 + a^2 T^3 / 3 + a / 2, a = skewness /
    (3 sqrt(n)), monotone, removing the skewness term of T's Edgeworth expansion, so that a
    skewed gain's one-sided error is second-order right); with ``bootstrap`` the studentised
    bootstrap
    (bootstrap-t: the t statistic's own distribution from resamples of the row, Efron &
    Tibshirani 1993, ch. 12.5; Hall 1992, sec. 3.10), second-order accurate under skew where
    the t test and the sign-flip test are not. A row without spread takes the sign test of
    its values against ``null`` (``scipy.stats.binom``; ties dropped): no statistic of a mean
    has a distribution there. NaN with fewer than two values."""
    x = np.asarray(x, dtype=float)
    n = x.shape[-1]
    if n < 2:
        return np.full(x.shape[:-1], math.nan)
    sign = 1.0 if alternative == "greater" else -1.0
    d = sign * (x - null)
    mean, sd = d.mean(-1), d.std(-1, ddof=1)
    flat = sd <= 1e-12 * np.maximum(1.0, np.abs(x).max(-1))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = mean / (sd / math.sqrt(n))
        if bootstrap:
            p = _bootstrap_t(d, t, rng if rng is not None else np.random.default_rng(0),
                             draws)
        elif skew:
            centred = d - mean[..., None]
            gamma = (centred ** 3).mean(-1) / np.maximum((centred ** 2).mean(-1), 1e-300) ** 1.5
            a = gamma / (3 * math.sqrt(n)) + skew_offset(n, shift, floor)
            p = stats.t.sf(hall(t, a), n - 1)
        else:
            p = stats.t.sf(t, n - 1)
    above, off = (d > 0).sum(-1), (d != 0).sum(-1)
    sign_p = np.where(off > 0, stats.binom.sf(above - 1, np.maximum(off, 1), 0.5), 1.0)
    return np.where(flat, sign_p, p)


def skew_offset(n: np.ndarray | float, shift: float = SKEW_SHIFT,
                floor: float = SKEW_SHIFT_MIN_N) -> np.ndarray:
    """Return the part of Hall's coefficient a that ``one_sided_q`` adds to the sample's:
    the skewness moved ``shift`` normal-theory standard errors (sqrt(6 / n)) to the
    conservative side, -shift sqrt(6 / n) / (3 sqrt(n)) = -shift sqrt(6) / (3 n), with n at
    least ``floor`` (``SKEW_SHIFT_MIN_N`` for one fixed look: a larger offset would flatten
    Hall's transformation within the t values that decide a small sample; the design's
    stages use the full offset, ``design.STAGE_SKEW_FLOOR``)."""
    return -shift * math.sqrt(6) / (3 * np.maximum(np.asarray(n, dtype=float), floor))


def hall(t: np.ndarray | float, a: np.ndarray | float) -> np.ndarray:
    """Return Hall's transformation g(T) = T + a T^2 + a^2 T^3 / 3 + a / 2 (Hall 1992, eq.
    2.3; monotone in T)."""
    return t + a * t ** 2 + a ** 2 * t ** 3 / 3 + a / 2


def hall_critical(crit: np.ndarray | float, n: np.ndarray | float,
                  shift: float = SKEW_SHIFT, floor: float = SKEW_SHIFT_MIN_N) -> np.ndarray:
    """Return the t statistic whose Hall transformation at zero sample skewness (a =
    ``skew_offset(n)``, the deterministic part of ``one_sided_q``'s correction) equals
    ``crit``: the critical value the test applies to T for a symmetric gain (g(T) = ((1 + a
    T)^3 - 1) / (3 a) + a / 2 inverted)."""
    n = np.asarray(n, dtype=float)
    a = skew_offset(n, shift, floor)
    crit = np.asarray(crit, dtype=float)
    if shift == 0:
        return crit + 0 * a
    return (np.cbrt(1 + 3 * a * (crit - a / 2)) - 1) / a


def _bootstrap_t(d: np.ndarray, t: np.ndarray, rng: np.random.Generator,
                 draws: int) -> np.ndarray:
    """Return P*(t* >= t) + 1 over draws + 1 for each row of ``d``: t* = (mean* - mean) /
    (sd* / sqrt(n)) over resamples of the row (one index set shared by the rows, in chunks)."""
    n = d.shape[-1]
    rows = d.reshape(-1, n)
    idx = rng.integers(0, n, size=(draws, n))
    hits = np.zeros(len(rows))
    mean = rows.mean(-1)
    chunk = max(1, 4_000_000 // (draws * n))
    for start in range(0, len(rows), chunk):
        r = rows[start:start + chunk][:, idx]                      # rows x draws x n
        m, s = r.mean(-1), r.std(-1, ddof=1)
        centred = m - mean[start:start + chunk, None]
        star = np.where(s > 0, centred / (s / math.sqrt(n)),
                        np.where(centred > 0, np.inf, np.where(centred < 0, -np.inf, 0.0)))
        hits[start:start + chunk] = (star >= t.reshape(-1)[start:start + chunk, None]).sum(-1)
    return ((hits + 1) / (draws + 1)).reshape(d.shape[:-1])
