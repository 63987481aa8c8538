"""The one-run audit's bound (Steinke, Nasr, Jagielski 2023, Thm 5.2) against closed forms."""

from __future__ import annotations

import math

import pytest

from dpbench.audit.bounds import epsilon_lower_bound, p_value_dp_audit


@pytest.mark.parametrize("r", [10, 40, 200])
def test_all_correct_with_delta_zero_is_the_randomised_response_tail(r):
    """With delta = 0 and r of r right, p = q^r, so epsilon_lower = logit(0.05^(1/r))."""
    q = 0.05 ** (1 / r)
    expected = math.log(q / (1 - q))
    assert epsilon_lower_bound(r, r, r, delta=0.0) == pytest.approx(expected, rel=1e-6)


def test_p_value_matches_the_binomial_tail_and_grows_with_delta():
    q = 1 / (1 + math.exp(-1.0))
    tail = sum(math.comb(20, k) * q**k * (1 - q) ** (20 - k) for k in range(15, 21))
    assert p_value_dp_audit(100, 20, 15, 1.0, 0.0) == pytest.approx(tail, rel=1e-9)
    assert p_value_dp_audit(100, 20, 15, 1.0, 1e-3) > p_value_dp_audit(100, 20, 15, 1.0, 0.0)


def test_chance_level_guessing_proves_nothing():
    assert epsilon_lower_bound(1000, 200, 100, delta=1e-5) == 0.0
    assert epsilon_lower_bound(1000, 200, 120, 1e-5) < epsilon_lower_bound(1000, 200, 160, 1e-5)
