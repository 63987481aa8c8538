"""User-level accounting (``dpbench/privacy/user_level.py``): ULS and ELS against dp-accounting
called directly on the same events, ELS at k = 1 against DP-SGD, the group-privacy baseline
above ELS, monotonicity, calibration and the combinations offered or refused."""

from __future__ import annotations

import itertools
import math

import pytest
from dp_accounting import dp_event as ev
from dp_accounting import privacy_accountant as pa
from dp_accounting.pld import pld_privacy_accountant as pldacc

from dpbench.errors import ConfigError
from dpbench.privacy import user_level as ul
from dpbench.privacy.accountant import ACCOUNTANTS, PrivacyAccountant, compose_epsilon
from dpbench.privacy.accountant_pld import canonical_groups, plan_interval
from dpbench.privacy.calibration import RELATIVE_TOLERANCE
from dpbench.privacy.samplers import NEIGHBOURING, SAMPLERS, Sampling

DELTA = 1e-5
REL = 1e-6


def _direct(event, interval, relation=pa.NeighboringRelation.ADD_OR_REMOVE_ONE):
    acc = pldacc.PLDAccountant(relation, value_discretization_interval=interval)
    acc.compose(event)
    return acc.get_epsilon(DELTA)


# (q_u, sigma, steps): user-level epsilons above 1, so dpbench's PLD uses its planned grid
ULS_CASES = [(0.05, 1.0, 200), (0.02, 0.8, 500), (0.1, 1.5, 100), (0.01, 0.7, 300)]


@pytest.mark.parametrize("q,sigma,steps", ULS_CASES)
def test_uls_equals_dp_accounting_on_the_poisson_over_users_event(q, sigma, steps):
    mine = ul.uls_epsilon([(sigma, q, steps)], DELTA)
    assert mine > 1.0
    interval = plan_interval(canonical_groups([(sigma, q, steps)]))
    # the event built independently: Poisson over users, a Gaussian relative to C, composed
    event = ev.SelfComposedDpEvent(ev.PoissonSampledDpEvent(q, ev.GaussianDpEvent(sigma)), steps)
    assert ul.uls_event(q, sigma, steps) == event
    assert mine == pytest.approx(_direct(event, interval), rel=REL)


# (q, k, sigma, steps): several bounds, small grids (a few seconds each on 2 cores)
ELS_CASES = [(0.05, 2, 2.0, 50), (0.02, 4, 3.0, 100), (0.1, 3, 4.0, 20), (0.01, 8, 4.0, 200)]


def _mixture(q, k, sigma):
    """The ELS step built from its definition: P[j of the user's k examples sampled]."""
    probs = [math.comb(k, j) * q**j * (1 - q) ** (k - j) for j in range(k + 1)]
    return ev.MixtureOfGaussiansDpEvent(sigma, [float(j) for j in range(k + 1)], probs)


@pytest.mark.parametrize("q,k,sigma,steps", ELS_CASES)
def test_els_equals_dp_accounting_on_the_mixture_of_gaussians_event(q, k, sigma, steps):
    mine, interval = ul.els_accounting([(sigma, q, steps)], k, DELTA)
    assert mine == ul.els_epsilon([(sigma, q, steps)], k, DELTA)
    event = ev.SelfComposedDpEvent(_mixture(q, k, sigma), steps)
    made = ul.els_event(q, sigma, steps, k)
    assert made.count == steps and made.event.standard_deviation == sigma
    assert list(made.event.sensitivities) == list(event.event.sensitivities)
    assert made.event.sampling_probs == pytest.approx(event.event.sampling_probs, rel=1e-12)
    assert mine == pytest.approx(_direct(event, interval), rel=REL)
    # zero-out (dp-accounting's REPLACE_SPECIAL) reads the same event the same way
    special = pa.NeighboringRelation.REPLACE_SPECIAL
    assert mine == pytest.approx(_direct(event, interval, special), rel=REL)


@pytest.mark.parametrize("q,sigma,steps", [(0.05, 1.0, 200), (0.02, 2.0, 300)])
def test_els_at_one_example_a_user_is_example_level_dp_sgd(q, sigma, steps):
    els, interval = ul.els_accounting([(sigma, q, steps)], 1, DELTA)
    poisson = ev.SelfComposedDpEvent(ev.PoissonSampledDpEvent(q, ev.GaussianDpEvent(sigma)),
                                     steps)
    # the one-component mixture is the Poisson-subsampled Gaussian: same grid, same epsilon
    assert els == pytest.approx(_direct(poisson, interval), rel=REL)
    # and within the grids' discretisation of dpbench's example-level accountant
    assert els == pytest.approx(compose_epsilon([(sigma, q, steps)], DELTA), rel=5e-3)


def test_group_privacy_baseline_is_above_els_and_example_level():
    q, sigma, steps = 0.02, 2.0, 100
    example = compose_epsilon([(sigma, q, steps)], DELTA)
    assert ul.group_privacy_epsilon(q, sigma, steps, 1, DELTA) == example
    previous = example
    for k in (2, 3, 4):
        els = ul.els_epsilon([(sigma, q, steps)], k, DELTA)
        group = ul.group_privacy_epsilon(q, sigma, steps, k, DELTA)
        assert example < els <= group
        assert group >= k * example  # k eps'(delta') with delta' < delta
        assert group > previous
        previous = group


def test_group_privacy_delta_is_the_induction_sum_below_the_textbook_bound():
    for eps, k in itertools.product((0.0, 0.1, 1.0, 3.0), (1, 2, 3, 8)):
        d = ul.group_privacy_delta(eps, 1e-9, k)
        assert d <= k * math.exp((k - 1) * eps) * 1e-9 * (1 + 1e-12)
        if k == 1:
            assert d == pytest.approx(k * math.exp((k - 1) * eps) * 1e-9, rel=1e-12)
        # the chain of k neighbours: delta_k = e^eps delta_{k-1} + delta'
        chained = 0.0
        for _ in range(k):
            chained = math.exp(eps) * chained + 1e-9
        assert d == pytest.approx(chained, rel=1e-12)


def test_group_privacy_satisfies_its_delta_and_is_infinite_where_no_delta_does():
    q, sigma, steps, k = 0.05, 1.0, 200, 4
    group = ul.group_privacy_epsilon(q, sigma, steps, k, DELTA)
    assert math.isfinite(group)
    assert ul.group_privacy_epsilon(0.05, 0.6, 2000, 64, DELTA) == math.inf


def test_els_grows_with_k_q_steps_and_falls_with_sigma():
    base = (0.05, 2, 2.0, 50)
    q, k, sigma, steps = base
    e = ul.els_epsilon([(sigma, q, steps)], k, DELTA)
    assert ul.els_epsilon([(sigma, q, steps)], k + 1, DELTA) > e
    assert ul.els_epsilon([(sigma, 2 * q, steps)], k, DELTA) > e
    assert ul.els_epsilon([(sigma, q, 2 * steps)], k, DELTA) > e
    assert ul.els_epsilon([(1.5 * sigma, q, steps)], k, DELTA) < e


def test_uls_does_not_depend_on_k_and_falls_with_sigma():
    history = [(1.0, 0.05, 200)]
    a = ul.user_epsilon(ul.UserLevel(ul.ULS, 1), history, DELTA)
    b = ul.user_epsilon(ul.UserLevel(ul.ULS, 64), history, DELTA)
    assert a == b == ul.uls_epsilon(history, DELTA)
    assert ul.uls_epsilon([(1.2, 0.05, 200)], DELTA) < a


@pytest.mark.parametrize("strategy,q,k", [
    (ul.ULS, 0.05, 8), pytest.param(ul.ELS, 0.05, 2, marks=pytest.mark.slow)])
def test_calibration_lands_just_below_the_target(strategy, q, k):
    target, steps = 4.0, 50
    sigma, accountant = ul.calibrate_user_noise_multiplier(strategy, target, DELTA, q, steps, k)
    assert accountant == "pld"
    spent = ul.user_epsilon(ul.UserLevel(strategy, k), [(sigma, q, steps)], DELTA)
    assert (1 - RELATIVE_TOLERANCE) * target <= spent <= target


def test_calibration_refuses_an_unreachable_target_naming_the_key():
    with pytest.raises(ConfigError, match=r"^privacy\.target_epsilon=1e-06 is below"):
        ul.calibrate_user_noise_multiplier(ul.ULS, 1e-6, DELTA, 0.5, 10_000, 4)


def test_every_offered_combination_is_accepted_and_every_other_refused_naming_the_key():
    offered = set(ul.valid_combinations())
    assert ul.Combination(ul.ELS, "poisson", "pld", "add_remove") in offered
    assert ul.Combination(ul.ULS, "poisson", "rdp", "add_remove") in offered
    for strategy, sampler, accountant, relation in itertools.product(
            ul.STRATEGIES, SAMPLERS, ACCOUNTANTS, NEIGHBOURING):
        combo = ul.Combination(strategy, sampler, accountant, relation)
        if combo in offered:
            assert ul.check_user_level(strategy, sampler, accountant, relation) == (
                relation, accountant)
            continue
        with pytest.raises(ConfigError) as err:
            ul.check_user_level(strategy, sampler, accountant, relation)
        message = str(err.value)
        assert "\n" not in message
        assert message.startswith(("trainer.sampler=", "privacy.neighbouring=",
                                   "privacy.accountant="))


def test_defaults_and_refusals_of_single_keys():
    assert ul.check_user_level(ul.ELS) == ("add_remove", "pld")
    assert ul.check_user_level(ul.ULS, neighbouring="replace_one") == ("replace_one", "pld")
    with pytest.raises(ConfigError, match=r"^privacy\.accountant=rdp has no accounting for "
                                          r"privacy\.user_strategy=els"):
        ul.check_user_level(ul.ELS, accountant="rdp")
    with pytest.raises(ConfigError, match=r"^privacy\.neighbouring=replace_one has no "):
        ul.check_user_level(ul.ELS, neighbouring="replace_one")
    with pytest.raises(ConfigError, match=r"^privacy\.user_strategy must be one of"):
        ul.check_user_level("dp_fedavg")
    with pytest.raises(ConfigError, match=r"^privacy\.unit must be one of"):
        ul.check_unit("household")
    for k in (0, -1, ul.MAX_EXAMPLES_PER_USER + 1, 2.5, True):
        with pytest.raises(ConfigError, match=r"^privacy\.max_examples_per_user must be"):
            ul.UserLevel(ul.ELS, k)


def test_run_accountant_reports_user_level_epsilon_and_resumes_only_the_same_unit():
    user = ul.UserLevel(ul.ELS, 3)
    acc = PrivacyAccountant("pld", Sampling(), user=user)
    acc.step(2.0, 0.05, count=40)
    acc.step(2.5, 0.05, count=10)
    history = [(2.0, 0.05, 40), (2.5, 0.05, 10)]
    assert acc.get_epsilon(DELTA) == ul.els_epsilon(history, 3, DELTA)
    state = acc.state_dict()
    assert state["user"] == {"strategy": "els", "max_examples_per_user": 3}
    again = PrivacyAccountant("pld", Sampling(), user=user)
    again.load_state_dict(state)
    assert again.get_epsilon(DELTA) == acc.get_epsilon(DELTA)
    with pytest.raises(ConfigError, match="privacy unit"):
        PrivacyAccountant("pld", Sampling()).load_state_dict(state)
    # an example-level accountant's state is as before: no user key
    plain = PrivacyAccountant("pld", Sampling())
    plain.step(1.0, 0.05, 10)
    assert "user" not in plain.state_dict()
    with pytest.raises(ConfigError, match=r"^privacy\.accountant=rdp"):
        PrivacyAccountant("rdp", Sampling(), user=user)


def test_user_dp_event_composes_one_event_per_run_of_steps():
    history = [(2.0, 0.05, 40), (2.5, 0.05, 10)]
    uls = ul.user_dp_event(ul.UserLevel(ul.ULS, 3), history)
    assert uls.events == [ul.uls_event(0.05, 2.0, 40), ul.uls_event(0.05, 2.5, 10)]
    els = ul.user_dp_event(ul.UserLevel(ul.ELS, 3), history)
    assert els.events == [ul.els_event(0.05, 2.0, 40, 3), ul.els_event(0.05, 2.5, 10, 3)]


def test_user_convention_names_the_pairs_that_read_the_events():
    uls = ul.user_convention(ul.UserLevel(ul.ULS, 4))
    assert uls["unit"] == "user" and uls["strategy"] == "uls" and uls["max_examples_per_user"] == 4
    assert {"accountant": "rdp", "neighboring_relation": "ADD_OR_REMOVE_ONE"} in uls["read_by"]
    els = ul.user_convention(ul.UserLevel(ul.ELS, 4), "zero_out")
    assert els["neighbouring"] == "zero_out"
    assert {p["accountant"] for p in els["read_by"]} == {"pld"}
    assert ul.user_convention(ul.UserLevel(ul.ULS, 4), "replace_one")["read_by"] == [
        {"accountant": "pld", "neighboring_relation": "REPLACE_ONE"}]
    with pytest.raises(ConfigError, match=r"^privacy\.neighbouring=replace_one"):
        ul.user_convention(ul.UserLevel(ul.ELS, 4), "replace_one")
