"""The accountants are upper bounds, bounded in time and memory, and cheap on a run's queries.

- GDP (a central-limit approximation) is refused with a one-line error naming the key.
- PLD's epsilon is at least dp-accounting's pessimistic PLD on a 20x finer grid (itself an
  upper bound on the truth), within 0.5 % of it, and below RDP's.
- Settings that would exhaust memory or time (sigma 0.01, target 1e300) are sized before
  allocating (grid caps) or refused with a message naming the key.
- The default delta is strictly below 1/N.
- Calibration plus a run's epsilon queries build few PLDs and compose once per new query
  (counted through the memo caches; speed itself is measured in docs/accounting.md).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpbench.config.schema import PrivacyConfig, TrainerConfig
from dpbench.errors import ConfigError
from dpbench.privacy import (
    PrivacyAccountant,
    calibrate_noise_multiplier,
    check_accountable,
    check_accountant,
    compose_epsilon,
    default_delta,
)
from dpbench.privacy import accountant_pld as pld
from dpbench.privacy.accountant_opacus import rdp_epsilon
from dpbench.privacy.plan import plan_privacy

DELTA = 1e-5
#: the demo: digits (N 1438), B 128, 10 epochs of int(1/q) = 11 steps
DEMO_Q, DEMO_STEPS = 128 / 1438, 110


def _clear_caches() -> None:
    pld.base_pmfs.cache_clear()
    pld.pld_epsilon.cache_clear()


def _reference_pld(sigma: float, q: float, steps: int, interval: float) -> float:
    """dp-accounting's pessimistic connect-the-dots PLD, composed directly (no dpbench code)."""
    from dp_accounting.pld import privacy_loss_distribution as P

    base = P.from_gaussian_mechanism(sigma, value_discretization_interval=interval,
                                     sampling_prob=q, pessimistic_estimate=True,
                                     use_connect_dots=True)
    return base.self_compose(steps).get_epsilon_for_delta(DELTA)


# ---- GDP refused ---------------------------------------------------------------------------
def test_gdp_is_refused_with_one_line_naming_the_key():
    for build in (lambda: check_accountant("gdp"), lambda: PrivacyAccountant("gdp"),
                  lambda: PrivacyConfig(accountant="gdp"),
                  lambda: calibrate_noise_multiplier(3.0, DELTA, 0.1, 100, "gdp")):
        with pytest.raises(ConfigError) as err:
            build()
        message = str(err.value)
        assert "privacy.accountant" in message and "gdp" in message and "\n" not in message
        assert "not an upper bound" in message


def test_default_accountant_is_pld():
    """privacy.accountant is null by default: the sampler's own, pld for Poisson batches."""
    from dpbench.privacy.samplers import default_accountant, settled_accountant

    assert PrivacyConfig().accountant is None
    assert settled_accountant({"accountant": None}, {}) == "pld"
    assert default_accountant("poisson", "add_remove") == "pld"
    assert PrivacyAccountant().mechanism == "pld"


# ---- PLD is an upper bound, and tight --------------------------------------------------------
@pytest.mark.parametrize("sigma,q,steps", [(1.59, DEMO_Q, DEMO_STEPS), (2.84, 0.05, 200),
                                           (0.79, 0.05, 200), (5.0, 0.5, 20), (1.0, 1.0, 10),
                                           (3.4, 0.01, 100)])
def test_pld_epsilon_bounds_the_finer_pessimistic_pld_and_is_tight(sigma, q, steps):
    acc = PrivacyAccountant("pld")
    acc.step(sigma, q, count=steps)
    eps = acc.get_epsilon(DELTA)
    interval = pld.plan_interval(pld.canonical_groups([(sigma, q, steps)]))
    fine = _reference_pld(sigma, q, steps, min(interval / 20, 1e-4))
    assert eps >= fine  # fine is itself >= the true epsilon
    assert eps <= fine * 1.005 + 1e-3
    assert eps <= rdp_epsilon(pld.canonical_groups([(sigma, q, steps)]), DELTA)


def test_heterogeneous_history_composes_per_group():
    """Steps at two sigmas in any order: one composition per (sigma, q) group, equal to
    dp-accounting's event-by-event PLD accountant up to the grids, and between the
    homogeneous runs at either sigma."""
    from dpbench.privacy.verify import pld_epsilon as event_by_event

    history = [(1.2, 0.05, 40), (2.0, 0.05, 30), (1.2, 0.05, 60)]
    eps = compose_epsilon(history, DELTA)
    assert eps == compose_epsilon([(2.0, 0.05, 30), (1.2, 0.05, 100)], DELTA)
    ledger = [{"sample_rate": q, "steps": k, "queries": [{"sensitivity": 1.0, "noise_std": s}]}
              for s, q, k in history]
    reference = event_by_event(ledger, DELTA)
    assert reference <= eps <= reference * 1.005 + 1e-3
    assert compose_epsilon([(2.0, 0.05, 130)], DELTA) < eps < compose_epsilon(
        [(1.2, 0.05, 130)], DELTA)


def test_many_distinct_sigmas_are_rounded_down_pessimistically():
    history = [(1.0 + i / 1000, 0.05, 2) for i in range(100)]
    groups = pld.canonical_groups(history)
    assert len(groups) <= pld.MAX_GROUPS and sum(k for *_, k in groups) == 200
    assert all(any(s <= h for s, _, _ in groups) for h, _, _ in history)
    assert compose_epsilon(history, DELTA) >= compose_epsilon([(1.099, 0.05, 200)], DELTA)
    spread = [(1.0 * 1.15**i, 0.01 * (1 + i % 3), 1) for i in range(40)]  # 2.4 decades, 3 rates
    groups = pld.canonical_groups(spread)
    assert len(groups) <= pld.MAX_GROUPS and sum(k for *_, k in groups) == 40
    from dpbench.privacy.verify import pld_epsilon as event_by_event

    ledger = [{"sample_rate": q, "steps": k, "queries": [{"sensitivity": 1.0, "noise_std": s}]}
              for s, q, k in spread]
    assert compose_epsilon(spread, DELTA) >= event_by_event(ledger, DELTA, discretization=2e-3)


@pytest.mark.parametrize("eps", [0.5, 3.0, 8.0])
def test_pld_calibration_hits_the_target_from_below(eps):
    sigma, used = calibrate_noise_multiplier(eps, DELTA, DEMO_Q, DEMO_STEPS, "pld")
    assert used == "pld"
    spent = compose_epsilon([(sigma, DEMO_Q, DEMO_STEPS)], DELTA)
    assert 0.99 * eps <= spent <= eps


@pytest.mark.parametrize("sigma,q,interval", [(0.9, DEMO_Q, 1e-3), (1.3, 0.01, 2e-3),
                                               (4.0, 1.0, 1e-4), (30.0, 0.5, 5e-2)])
def test_the_step_pmfs_are_dp_accountings_own(sigma, q, interval):
    """dpbench builds one step's PMFs from dp-accounting's public functions; they equal, to
    the bit, those of its from_gaussian_mechanism (read here through its private fields,
    the only way to see them)."""
    from dp_accounting.pld import privacy_loss_distribution as P

    ref = P.from_gaussian_mechanism(standard_deviation=sigma, sensitivity=1.0,
                                    pessimistic_estimate=True, sampling_prob=q,
                                    value_discretization_interval=interval,
                                    use_connect_dots=True)
    for theirs, ours in zip((ref._pmf_remove, ref._pmf_add), pld.base_pmfs(sigma, q, interval)):
        theirs = theirs.to_dense_pmf()
        assert (theirs._lower_loss, theirs._infinity_mass) == (ours._lower_loss,
                                                               ours._infinity_mass)
        assert np.array_equal(theirs._probs, pld.dense_probabilities(ours))


# ---- bounded time and memory -----------------------------------------------------------------
@pytest.mark.parametrize("sigma,q,steps", [(0.01, DEMO_Q, DEMO_STEPS), (0.01, 1.0, 10**6),
                                           (1e3, 0.5, 10**6)])
def test_extreme_accepted_settings_stay_within_the_grid_caps(sigma, q, steps):
    check_accountable(sigma, q, steps, DELTA, "pld")  # accepted
    groups = pld.canonical_groups([(sigma, q, steps)])
    interval = pld.plan_interval(groups)
    for pmf in pld.base_pmfs(sigma, q, interval):
        assert pmf.size <= 2 * pld.BASE_POINTS_CAP
        assert pmf.self_compose(steps).size <= pld.COMPOSED_POINTS_CAP
    assert pld.composed_points(sigma, q, interval, steps) <= pld.COMPOSED_POINTS_CAP
    eps = compose_epsilon([(sigma, q, steps)], DELTA)
    assert eps > 0 and not math.isnan(eps)


def test_prv_grid_is_sized_before_allocating_and_refused():
    with pytest.raises(ConfigError, match=r"^privacy\.accountant=prv cannot account "
                                          r"noise_multiplier=0\.01 .* use privacy\.accountant=pld"):
        check_accountable(0.01, DEMO_Q, DEMO_STEPS, DELTA, "prv")


@pytest.mark.parametrize("sigma", [0.001, 1e-6, 1e5])
def test_noise_multiplier_outside_the_accepted_range_is_refused(sigma):
    with pytest.raises(ConfigError, match=r"^privacy\.noise_multiplier must be in \[0\.01, 1000\]"):
        check_accountable(sigma, DEMO_Q, DEMO_STEPS, DELTA, "pld")


@pytest.mark.parametrize("accountant", ["pld", "rdp", "prv"])
def test_unreachable_large_target_is_refused_after_one_accountant_call(accountant):
    _clear_caches()
    with pytest.raises(ConfigError, match=r"^privacy\.target_epsilon=1e\+300 is above what the "
                                          r"smallest noise multiplier"):
        calibrate_noise_multiplier(1e300, DELTA, DEMO_Q, DEMO_STEPS, accountant)
    assert pld.cache_counts()["compositions"] <= 1


def test_unreachable_small_target_is_refused():
    with pytest.raises(ConfigError, match=r"^privacy\.target_epsilon=1e-06 is below what the "
                                          r"largest noise multiplier"):
        calibrate_noise_multiplier(1e-6, DELTA, DEMO_Q, DEMO_STEPS, "pld")


def _plan(n: int, **privacy) -> object:
    return plan_privacy(PrivacyConfig(**privacy), TrainerConfig(epochs=1, batch_size=64), n,
                        True)


def test_plan_refuses_huge_target_before_training():
    with pytest.raises(ConfigError, match="privacy.target_epsilon"):
        _plan(1438, target_epsilon=1e300)


# ---- default delta ---------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 9, 10, 99, 100, 1438, 10**4, 99_999, 10**5, 10**5 + 1, 10**6,
                               10**7, 123_456_789])
def test_default_delta_is_strictly_below_one_over_n(n):
    assert default_delta(n) < 1 / n
    assert default_delta(n) <= 1e-5


def test_plan_accepts_the_default_delta_at_a_power_of_ten():
    plan = _plan(10**5, noise_multiplier=1.0, target_epsilon=None)
    assert plan.delta == pytest.approx(1e-6)


# ---- cached, incremental accounting ----------------------------------------------------------
def test_demo_calibration_and_queries_build_few_plds():
    """Calibration, then the loop's queries (each epoch, twice) and a resume: a handful of
    base PLDs and one composition per distinct step count."""
    _clear_caches()
    sigma, _ = calibrate_noise_multiplier(3.0, DELTA, DEMO_Q, DEMO_STEPS, "pld")
    calibration = pld.cache_counts()
    assert calibration["compositions"] <= 12 and calibration["base_builds"] <= 12
    acc = PrivacyAccountant("pld")
    spent = []
    for step in range(1, DEMO_STEPS + 1):
        acc.step(sigma, DEMO_Q)
        if step % 11 == 0:
            spent += [acc.get_epsilon(DELTA), acc.get_epsilon(DELTA)]
    counts = pld.cache_counts()
    assert counts["compositions"] - calibration["compositions"] <= 10
    assert counts["base_builds"] - calibration["base_builds"] <= 2
    assert spent == sorted(spent) and 0.99 * 3.0 <= spent[-1] <= 3.0
    resumed = PrivacyAccountant("pld")
    resumed.load_state_dict(acc.state_dict())
    assert resumed.get_epsilon(DELTA) == spent[-1]
    assert pld.cache_counts() == counts  # the resumed accountant answers from the cache


def test_long_run_epoch_queries_reuse_base_plds():
    """10,000 steps at q = 0.01 queried every 1,000 steps: a base PLD per grid interval used
    (at most three), not per query, and epsilon non-decreasing."""
    _clear_caches()
    acc = PrivacyAccountant("pld")
    spent = []
    for _ in range(10):
        acc.step(1.0, 0.01, count=1000)
        spent.append(acc.get_epsilon(DELTA))
    counts = pld.cache_counts()
    assert counts["base_builds"] <= 3 and counts["compositions"] == 10
    assert spent == sorted(spent)
