"""``verify.event_epsilon`` re-derives an ELS run's epsilon from its recorded event (the
mixture of Gaussians), equal to dp-accounting called directly on the same event."""

from __future__ import annotations

import math

import pytest
from dp_accounting import dp_event as ev
from dp_accounting import privacy_accountant as pa
from dp_accounting.pld import pld_privacy_accountant as pldacc

from dpbench.privacy import user_level as ul
from dpbench.privacy.ledger import from_json, to_json
from dpbench.privacy.verify import els_groups, event_epsilon

DELTA = 1e-5
REL = 1e-6


def _mixture(q, k, sigma):
    """The ELS step from its definition, built apart from dpbench: Binomial(k, q) weights."""
    probs = [math.comb(k, j) * q**j * (1 - q) ** (k - j) for j in range(k + 1)]
    return ev.MixtureOfGaussiansDpEvent(sigma, [float(j) for j in range(k + 1)], probs)


def _direct(event, interval, relation=pa.NeighboringRelation.ADD_OR_REMOVE_ONE):
    acc = pldacc.PLDAccountant(relation, value_discretization_interval=interval)
    acc.compose(event)
    return acc.get_epsilon(DELTA)


# (k, [(q, sigma, steps), ...]): one run of steps, and a history of two (a resumed run)
CASES = [(2, [(0.05, 2.0, 50)]), (4, [(0.02, 3.0, 100)]), (8, [(0.01, 4.0, 200)]),
         (3, [(0.1, 4.0, 10), (0.05, 3.0, 20)])]


@pytest.mark.parametrize("k,runs", CASES)
def test_event_epsilon_of_an_els_record_equals_dp_accounting(k, runs):
    user = ul.UserLevel("els", k)
    history = [(sigma, q, steps) for q, sigma, steps in runs]
    recorded = to_json(ul.user_dp_event(user, history))  # results.json's mechanism.event
    mine = event_epsilon(recorded, DELTA, "pld", ul.user_convention(user))
    _, interval = ul.els_accounting(history, k, DELTA)
    direct = ev.ComposedDpEvent([ev.SelfComposedDpEvent(_mixture(q, k, sigma), steps)
                                 for q, sigma, steps in runs])
    assert mine == pytest.approx(_direct(direct, interval), rel=REL)
    assert mine == pytest.approx(ul.user_epsilon(user, history, DELTA), rel=REL)
    # zero-out (dp-accounting's REPLACE_SPECIAL) reads the mixture the same way
    zero_out = ul.user_convention(user, "zero_out")
    assert event_epsilon(recorded, DELTA, "pld", zero_out) == pytest.approx(
        _direct(direct, interval, pa.NeighboringRelation.REPLACE_SPECIAL), rel=REL)


def test_the_groups_are_read_back_from_the_event():
    event = from_json(to_json(ul.els_event(0.03, 2.5, 40, 5)))
    k, groups = els_groups(event)
    assert k == 5 and len(groups) == 1
    sigma, q, steps = groups[0]
    assert (sigma, steps) == (2.5, 40) and q == pytest.approx(0.03, rel=1e-12)
    assert els_groups(ul.uls_event(0.03, 2.5, 40)) is None  # ULS: Poisson, not a mixture


@pytest.mark.parametrize("event, message", [
    (ev.MixtureOfGaussiansDpEvent(1.0, [0.0, 1.0, 2.0], [0.5, 0.3, 0.2]), "not Binomial"),
    (ev.MixtureOfGaussiansDpEvent(1.0, [0.0, 2.0], [0.9, 0.1]), "not an ELS step"),
    (ev.ComposedDpEvent([_mixture(0.1, 2, 1.0), ev.PoissonSampledDpEvent(
        0.1, ev.GaussianDpEvent(1.0))]), "another kind of event"),
    (ev.ComposedDpEvent([_mixture(0.1, 2, 1.0), _mixture(0.1, 3, 1.0)]), "another cap k"),
    (ev.PoissonSampledDpEvent(0.1, _mixture(0.1, 2, 1.0)), "inside a PoissonSampledDpEvent"),
])
def test_mixtures_that_are_not_els_are_refused(event, message):
    with pytest.raises(ValueError, match=message):
        event_epsilon(event, DELTA, "pld", ul.user_convention(ul.UserLevel("els", 2)))


def test_only_the_pld_accountant_reads_the_mixture():
    user = ul.UserLevel("els", 2)
    with pytest.raises(ValueError, match="only pld"):
        event_epsilon(ul.els_event(0.1, 2.0, 10, 2), DELTA, "rdp", ul.user_convention(user))
