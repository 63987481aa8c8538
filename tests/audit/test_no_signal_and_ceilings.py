"""Every epsilon lower bound proves nothing from scores without signal, and its recorded
ceiling is the bound of a perfect attack at that size; the f-DP one-run bound is at least
the Steinke-Nasr-Jagielski bound on the same guesses (wherever either certifies anything)."""

from __future__ import annotations

import numpy as np
import pytest

from dpbench.audit.bounds import (
    audit_power,
    audit_power_fdp,
    epsilon_lower_bound,
    epsilon_lower_bound_fdp,
)
from dpbench.audit.mia.metrics import empirical_epsilon, perfect_attack_bound

SEEDS = 1000
DELTA = 1e-5


def _mia_bounds(make_scores, n: int) -> np.ndarray:
    out = np.empty(SEEDS)
    for seed in range(SEEDS):
        rng = np.random.default_rng(seed)
        scores, members = make_scores(rng, n)
        out[seed] = empirical_epsilon(scores, members, DELTA, 0.95, rng)["epsilon_lower"]
    return out


def _random_scores(rng, n):
    return rng.normal(size=n), rng.random(n) < 0.5


def _permuted_labels(rng, n):
    """Scores that do separate the true members, judged against permuted labels."""
    members = rng.random(n) < 0.5
    return rng.normal(size=n) + 3.0 * members, rng.permutation(members)


@pytest.mark.parametrize("make_scores", [_random_scores, _permuted_labels])
def test_mia_bound_is_zero_without_signal_in_95_percent_of_seeds(make_scores):
    bounds = _mia_bounds(make_scores, 200)
    assert (bounds == 0).mean() >= 0.95, (bounds == 0).mean()


def _correct_guesses(rng, m: int, k_in: int, k_out: int, permuted: bool) -> int:
    included = rng.random(m) < 0.5
    scores = rng.normal(size=m) + (4.0 * included if permuted else 0.0)
    truth = rng.permutation(included) if permuted else included
    order = np.argsort(-scores)
    return int(truth[order[:k_in]].sum() + (~truth[order[m - k_out:]]).sum())


@pytest.mark.parametrize("permuted", [False, True])
@pytest.mark.parametrize("bound", [epsilon_lower_bound, epsilon_lower_bound_fdp])
def test_one_run_bounds_are_zero_without_signal_in_95_percent_of_seeds(bound, permuted):
    m, k_in, k_out = 1000, 100, 100
    correct = [_correct_guesses(np.random.default_rng(s), m, k_in, k_out, permuted)
               for s in range(SEEDS)]
    values = {v: bound(m, k_in + k_out, v, DELTA) for v in set(correct)}  # cached per count
    zero = np.mean([values[v] == 0 for v in correct])
    assert zero >= 0.95, zero


@pytest.mark.parametrize("n", [100, 400, 1000, 2001])
def test_a_recorded_mia_ceiling_is_the_bound_of_a_perfect_attack(n):
    members = np.random.default_rng(n).random(n) < 0.5
    noisy = np.random.default_rng(n + 1).normal(size=n) + members
    recorded = empirical_epsilon(noisy, members, DELTA, 0.95, np.random.default_rng(7))
    perfect = empirical_epsilon(members.astype(float), members, DELTA, 0.95,
                                np.random.default_rng(7))  # the same halves
    assert recorded["ceiling"] == pytest.approx(perfect["epsilon_lower"], rel=1e-12)
    assert recorded["epsilon_lower"] <= recorded["ceiling"]


def test_mia_ceilings_at_the_pool_sizes_of_the_docs():
    """Half the pool is evaluated, half of it members: pool 400 -> 3.3, pool 1000 -> 4.2."""
    assert perfect_attack_bound(100, 100, DELTA, 0.95) == pytest.approx(3.29, abs=0.01)
    assert perfect_attack_bound(250, 250, DELTA, 0.95) == pytest.approx(4.21, abs=0.01)


def test_one_run_ceilings_are_the_bounds_of_every_guess_right():
    assert audit_power(1000, 200, DELTA) == epsilon_lower_bound(1000, 200, 200, DELTA)
    assert audit_power_fdp(1000, 200, DELTA) == epsilon_lower_bound_fdp(1000, 200, 200, DELTA)


@pytest.mark.parametrize("m, r", [(40, 40), (200, 40), (1000, 100), (1000, 200), (1000, 388),
                                  (2000, 600), (5000, 1500), (10000, 2000)])
def test_fdp_bound_is_at_least_the_snj_bound_on_the_same_guesses(m, r):
    """Every outcome from below chance to all right, every count near chance: the f-DP
    bound is at least SNJ's on the same guesses, and strictly above it wherever the
    recursion is the sharper test (its tail bound is looser only just above chance)."""
    near = range(max(0, r // 2 - 3), min(r, r // 2 + 2 * int(r ** 0.5) + 4) + 1)
    counts = sorted(set(near) | set(range(0, r + 1, max(1, r // 40))) | {r})
    for v in counts:
        snj, fdp = epsilon_lower_bound(m, r, v, DELTA), epsilon_lower_bound_fdp(m, r, v, DELTA)
        assert fdp >= snj, (m, r, v, snj, fdp)
    assert epsilon_lower_bound_fdp(m, r, r, DELTA) > epsilon_lower_bound(m, r, r, DELTA)


def test_fdp_bound_near_chance_is_the_snj_bound_where_the_recursion_is_looser():
    """26 of 40 right: the recursion alone certifies less than SNJ (its tail bound at
    epsilon -> 0 is 0.0455 against the exact binomial 0.0404), so the combined test's bound
    is SNJ's; 28 of 40: the recursion's, above SNJ's."""
    assert epsilon_lower_bound_fdp(40, 40, 26, DELTA) == epsilon_lower_bound(40, 40, 26, DELTA)
    assert epsilon_lower_bound_fdp(40, 40, 26, DELTA) > 0.03
    assert epsilon_lower_bound_fdp(40, 40, 28, DELTA) > 2 * epsilon_lower_bound(40, 40, 28, DELTA)
