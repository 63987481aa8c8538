"""Intervals and paired differences against scipy on fixed numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpbench.analysis.stats import paired_difference, t_interval, verdict

VALUES = [0.81, 0.84, 0.79, 0.86, 0.83]


def test_t_interval_equals_scipy():
    got = t_interval(VALUES)
    low, high = stats.t.interval(0.95, df=4, loc=np.mean(VALUES), scale=stats.sem(VALUES))
    assert got.n == 5
    assert got.mean == pytest.approx(np.mean(VALUES))
    assert (got.low, got.high) == pytest.approx((low, high), rel=1e-12)


def test_t_interval_drops_non_finite_and_handles_small_n():
    assert t_interval([0.5, math.nan, None]).n == 1
    assert math.isnan(t_interval([]).mean)
    assert t_interval([0.5]).format() == "0.5000 (n=1)"


def test_paired_difference_equals_scipy_paired_test():
    a = {0: 0.90, 1: 0.88, 2: 0.91, 3: 0.87, 4: 0.92, 9: 0.5}  # seed 9 has no pair
    b = {0: 0.86, 1: 0.86, 2: 0.88, 3: 0.86, 4: 0.88}
    diff = paired_difference(a, b)
    d = np.array([a[s] - b[s] for s in range(5)])
    ref = stats.ttest_rel([a[s] for s in range(5)], [b[s] for s in range(5)])
    low, high = ref.confidence_interval(0.95)
    assert diff.n == 5 and diff.mean == pytest.approx(d.mean())
    assert (diff.low, diff.high) == pytest.approx((low, high), rel=1e-10)
    assert verdict(diff) == "better"
    assert verdict(diff, higher_is_better=False) == "worse"


def test_verdict_is_tie_when_interval_contains_zero():
    diff = paired_difference({0: 0.9, 1: 0.8, 2: 0.85}, {0: 0.85, 1: 0.85, 2: 0.85})
    assert diff.low < 0 < diff.high
    assert verdict(diff) == "tie"
    assert verdict(paired_difference({0: 1.0}, {0: 0.0})) == "n/a"


@pytest.mark.parametrize("metric", ["rmse", "mae", "mape", "crps", "js", "acf_distance", "ece",
                                    "nll", "brier", "accuracy_parity"])
def test_error_metrics_count_lower_as_better(metric):
    from dpbench.analysis.stats import higher_is_better

    assert not higher_is_better(metric)
    assert higher_is_better("accuracy") and higher_is_better("worst_class_accuracy")


# --- the tests behind the claims' verdicts ---------------------------------------------------

GAINS = [0.012, -0.004, 0.021, 0.008, 0.015]


@pytest.mark.parametrize("alternative", ["greater", "less"])
def test_one_sided_p_equals_scipy(alternative):
    from dpbench.analysis.stats import one_sided_p

    want = stats.ttest_1samp(GAINS, 0.01, alternative=alternative).pvalue
    assert one_sided_p(GAINS, 0.01, alternative) == pytest.approx(want, rel=1e-12)
    # no spread: the exact sign-flip test, whose smallest p with 3 values is 2^-3
    assert one_sided_p([0.25, 0.25, 0.25], 0.125, "greater") == 0.125
    assert math.isnan(one_sided_p([0.2], 0.1, "greater"))


def test_tost_is_below_alpha_exactly_when_the_90_interval_is_inside_the_margin():
    from dpbench.analysis.stats import tost

    ninety = t_interval(GAINS, level=0.90)
    for margin in (0.01, 0.02, 0.025, 0.03):
        inside = -margin < ninety.low and ninety.high < margin
        assert (tost(GAINS, -margin, margin) <= 0.05) == inside
    # at the interval's own edge the p-value is 0.05 itself
    edge = max(-ninety.low, ninety.high)
    assert tost(GAINS, -edge, edge) == pytest.approx(0.05, rel=1e-9)


def test_holm_and_benjamini_hochberg_on_fixed_numbers():
    from dpbench.analysis.stats import benjamini_hochberg, holm

    p = [0.01, 0.04, 0.03, 0.005]
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])  # 3x, max(2x, ...), 1x, 4x
    assert benjamini_hochberg(p) == pytest.approx([0.02, 0.04, 0.04, 0.02])
    nan = holm([0.02, math.nan, 0.01])
    assert nan[0] == pytest.approx(0.02) and math.isnan(nan[1]) and nan[2] == 0.02


def test_seeds_for_power_matches_the_noncentral_t_and_is_the_smallest():
    from dpbench.analysis.stats import seeds_for_power

    # effect = one standard deviation, one-sided 2.5 %: 10 pairs (power 0.80; 9 give 0.76)
    assert seeds_for_power(1.0, 1.0) == 10

    def power(n):
        crit = stats.t.ppf(0.975, n - 1)
        return stats.nct.sf(crit, n - 1, math.sqrt(n))

    assert power(10) >= 0.8 > power(9)
    assert seeds_for_power(0.05, 0.001) is None  # beyond 1000
    assert seeds_for_power(0.02, 0.01) > seeds_for_power(0.02, 0.02)


def test_seeds_for_tost_gives_the_power_it_promises_in_simulation():
    from dpbench.analysis.stats import seeds_for_tost, tost

    n = seeds_for_tost(1.0, 1.0)
    rng = np.random.default_rng(np.random.SeedSequence(7))

    def power(k, draws=4000):  # TOST at 2.5 % a side: the 95 % interval inside (-1, 1)
        x = rng.normal(0, 1, (draws, k))
        half = stats.t.ppf(0.975, k - 1) * x.std(axis=1, ddof=1) / math.sqrt(k)
        return np.mean(np.abs(x.mean(axis=1)) + half < 1)

    assert power(n) >= 0.78  # 0.8 promised; 4000 draws: standard error about 0.006
    assert power(n - 1) < 0.8
    sample = rng.normal(0, 1, n)
    ninety = t_interval(sample, level=0.95)
    assert (tost(sample, -1, 1) <= 0.025) == (-1 < ninety.low and ninety.high < 1)


def test_probability_of_improvement_counts_ties_as_half():
    from dpbench.analysis.stats import probability_of_improvement

    assert probability_of_improvement([1.0, -1.0, 0.0, 2.0]) == 0.625
    assert math.isnan(probability_of_improvement([]))


def test_sign_flip_p_is_the_exact_enumeration_and_its_interval_inverts_it():
    import itertools

    from dpbench.analysis.stats import sign_flip_interval, sign_flip_p

    x = np.array(GAINS)
    flips = np.array(list(itertools.product([-1, 1], repeat=len(x))))
    d = x - 0.002
    want = np.mean((flips * d).mean(axis=1) >= d.mean() - 1e-15)
    assert sign_flip_p(x, 0.002, "greater") == pytest.approx(want, abs=1e-12)
    low, high = sign_flip_interval(np.arange(1.0, 8.0), 0.95)
    assert sign_flip_p(np.arange(1.0, 8.0), low - 1e-6, "greater") <= 0.025
    assert sign_flip_p(np.arange(1.0, 8.0), low + 1e-6, "greater") > 0.025
    assert sign_flip_interval([0.012, 0.012], 0.95) == (-math.inf, math.inf)


def test_power_and_the_spread_bound_equal_their_scipy_formulas():
    from dpbench.analysis.stats import sd_upper_bound, t_power

    n = np.arange(3, 40)
    crit = stats.t.ppf(1 - 0.0125, n - 1)
    want = stats.nct.sf(crit, n - 1, 0.7 * np.sqrt(n) / 1.3)
    assert t_power(0.7, 1.3, n, 0.0125) == pytest.approx(want, rel=1e-9)
    # (n - 1) s^2 / sigma^2 ~ chi2: sigma <= s sqrt((n - 1) / chi2_{0.2, n - 1}) with 80 %
    assert sd_upper_bound(2.0, 5) == pytest.approx(2.0 * math.sqrt(4 / stats.chi2.ppf(0.2, 4)))


def test_hall_critical_inverts_the_transformation_at_zero_skewness():
    from dpbench.analysis.stats import hall, hall_critical, skew_offset

    n = np.arange(4, 200, dtype=float)   # (at 3 values and no floor the cubic term wins)
    crit = stats.t.isf(0.004, n - 1)
    for floor in (1.0, 24.0):
        t = hall_critical(crit, n, floor=floor)
        a = skew_offset(n, floor=floor)
        assert hall(t, a) == pytest.approx(crit, rel=8 * np.finfo(np.float64).eps ** 0.5)
        assert (t > crit).all()   # the offset is conservative for a symmetric gain
    # the offset is sqrt(6 / n) standard errors of the skewness, Hall's a = that / (3 sqrt n)
    assert skew_offset(40.0) == pytest.approx(-math.sqrt(6 / 40) / (3 * math.sqrt(40)))
    assert skew_offset(5.0) == skew_offset(24.0)
    assert skew_offset(5.0, floor=1.0) == pytest.approx(-math.sqrt(6 / 5) / (3 * math.sqrt(5)))


def test_the_claims_test_holds_its_level_under_skew_where_hall_alone_does_not():
    """Left-skewed gains (a standardised gamma of shape 2) at the null, 40 values, the
    one-sided level 0.025 / 6 (Holm's first level in a paper of six claims), 100,000 draws
    (a binomial SE of 4.9 % of the level): Hall's transformation at the plain sample skewness
    rejects 1.5x as often as it should; moved one standard error to the conservative side it
    stays within the level plus 3 SE. Symmetric (normal) gains: at most the level."""
    from dpbench.analysis.stats import one_sided_q

    rng = np.random.default_rng(np.random.SeedSequence(40))
    level, draws = 0.025 / 6, 100_000
    left = -(rng.gamma(2.0, 1.0, (draws, 40)) - 2.0) / math.sqrt(2.0)
    slack = 3 * math.sqrt(level * (1 - level) / draws)
    assert np.mean(one_sided_q(left, 0.0, "greater", shift=0.0) <= level) > 1.4 * level
    assert np.mean(one_sided_q(left, 0.0, "greater") <= level) <= level + slack
    normal = rng.standard_normal((draws, 40))
    assert np.mean(one_sided_q(normal, 0.0, "greater") <= level) <= level + slack
