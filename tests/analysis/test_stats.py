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
