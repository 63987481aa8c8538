"""Each sampler's accountant equals dp-accounting run directly, is never below a proven lower
bound, calibrates to its target, and a sampler without a valid accountant is refused."""

from __future__ import annotations

import math
import warnings

import pytest
from dp_accounting import dp_event as ev
from dp_accounting import privacy_accountant as pa
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import optimize, stats

from dpbench.errors import ConfigError
from dpbench.privacy.accountant import PrivacyAccountant
from dpbench.privacy.calibration import RELATIVE_TOLERANCE, calibrate_noise_multiplier
from dpbench.privacy.gap import epsilon_if_poisson, lower_bound
from dpbench.privacy.record_check import ledger_epsilon
from dpbench.privacy.samplers import (
    ADD_REMOVE,
    REPLACE_ONE,
    SAMPLERS,
    ZERO_OUT,
    Sampling,
    resolve_sampling,
)
from dpbench.privacy.shuffle_bound import shuffle_lower_bound

DELTA = 1e-5


def _accounted(sampling: Sampling, accountant: str, sigma: float, steps: int) -> float:
    acc = PrivacyAccountant(accountant, sampling)
    for _ in range(steps):  # step by step, as the loop does
        acc.step(noise_multiplier=sigma, sample_rate=sampling.batch_size / sampling.dataset_size)
    return acc.get_epsilon(DELTA)


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """Exact epsilon of the Gaussian mechanism with sensitivity/std ratio ``mu`` (Balle, Wang
    2018, Thm 8: delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)), in float64."""
    def excess(eps: float) -> float:
        return (stats.norm.cdf(mu / 2 - eps / mu)
                - math.exp(eps) * stats.norm.cdf(-mu / 2 - eps / mu) - delta)
    return optimize.brentq(excess, 0.0, 500.0, xtol=1e-12)


@pytest.mark.parametrize("n,batch,sigma,steps", [(1000, 50, 1.2, 60), (60000, 256, 0.9, 500)])
def test_fixed_size_equals_dp_accounting_rdp_without_replacement(n, batch, sigma, steps):
    sampling = Sampling("fixed_size", REPLACE_ONE, n, batch, n // batch)
    got = _accounted(sampling, "rdp", sigma, steps)
    acc = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=pa.NeighboringRelation.REPLACE_ONE)
    # replace-one moves the clipped sum by up to 2C: the multiplier to that sensitivity is sigma/2
    acc.compose(ev.SampledWithoutReplacementDpEvent(n, batch, ev.GaussianDpEvent(sigma / 2)),
                steps)
    assert got == pytest.approx(acc.get_epsilon(DELTA), rel=1e-12)


@pytest.mark.parametrize("n,batch,sigma,epochs", [
    (1438, 128, 3.9, 2), (5000, 100, 1.5, 5),
    pytest.param(50000, 500, 1.0, 20, marks=pytest.mark.slow)])
def test_shuffle_equals_one_gaussian_per_epoch(n, batch, sigma, epochs):
    spe = n // batch
    sampling = Sampling("shuffle", REPLACE_ONE, n, batch, spe)
    exact = _gaussian_epsilon(2 * math.sqrt(epochs) / sigma, DELTA)  # E Gaussians at sigma/2
    # dp-accounting's PLD under REPLACE_ONE doubles a Gaussian's sensitivity itself: sigma;
    # under ADD_OR_REMOVE_ONE a Gaussian's shift is its sensitivity: sigma / 2. Both agree.
    direct = []
    for relation, multiplier in ((pa.NeighboringRelation.REPLACE_ONE, sigma),
                                 (pa.NeighboringRelation.ADD_OR_REMOVE_ONE, sigma / 2)):
        acc = pld_privacy_accountant.PLDAccountant(
            neighboring_relation=relation, value_discretization_interval=1e-4)
        acc.compose(ev.GaussianDpEvent(multiplier), epochs)
        direct.append(acc.get_epsilon(DELTA))
    assert direct[0] == pytest.approx(direct[1], rel=1e-3)
    direct = direct[0]
    for accountant in ("pld", "rdp"):
        got = _accounted(sampling, accountant, sigma, spe * epochs)
        assert got >= exact * (1 - 1e-9)  # an upper bound
    got = _accounted(sampling, "pld", sigma, spe * epochs)
    assert got == pytest.approx(direct, rel=5e-3) and direct == pytest.approx(exact, rel=5e-3)
    # a partial epoch is a whole epoch of accounting
    assert _accounted(sampling, "pld", sigma, spe * epochs + 1) > got


@pytest.mark.parametrize("sigma,q,steps", [(1.1, 0.01, 300), (0.8, 0.05, 100)])
def test_poisson_equals_dp_accounting_pld(sigma, q, steps):
    n = 10000
    sampling = Sampling("poisson", ADD_REMOVE, n, int(q * n), int(1 / q))
    got = _accounted(sampling, "pld", sigma, steps)
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(ev.PoissonSampledDpEvent(q, ev.GaussianDpEvent(sigma)), steps)
    assert got == pytest.approx(acc.get_epsilon(DELTA), rel=5e-3)


@pytest.mark.parametrize("sampler,accountant", [("shuffle", "pld"), ("fixed_size", "rdp")])
def test_ledger_re_derivation_matches_the_run_accountant(sampler, accountant):
    from dpbench.privacy.ledger import PrivacyLedger, Query

    n, batch, sigma = 2000, 100, 1.5
    sampling = Sampling(sampler, REPLACE_ONE, n, batch, n // batch)
    acc, ledger = PrivacyAccountant(accountant, sampling), PrivacyLedger()
    for _ in range(45):  # two epochs and a bit
        s = ledger.record(batch / n, [Query("gradient", 1.0, sigma)], sampling.to_json())
        acc.step(noise_multiplier=s, sample_rate=batch / n)
    rederived = ledger_epsilon(ledger.to_json(), DELTA)
    assert acc.get_epsilon(DELTA) == pytest.approx(rederived, rel=5e-3)


@pytest.mark.parametrize("sigma,spe,epochs", [(0.8, 11, 2), (1.0, 100, 3), (2.0, 22, 10),
                                              (0.6, 1000, 1)])
def test_shuffle_accountant_never_below_chua_lower_bound(sigma, spe, epochs):
    sampling = Sampling("shuffle", REPLACE_ONE, spe * 10, 10, spe)
    history = [(sigma, 0.1, spe * epochs)]
    low = lower_bound(sampling, history, DELTA)
    valid = _accounted(sampling, "pld", sigma, spe * epochs)
    assert 0 < low <= valid


def test_chua_lower_bound_is_the_gaussian_for_one_batch_per_epoch():
    """T = 1: the maximum is the Gaussian itself; the binned, optimistic bound stays just below
    the exact Gaussian epsilon (so it is neither vacuous nor above the truth)."""
    for s, epochs in ((1.0, 1), (2.0, 4)):
        exact = _gaussian_epsilon(math.sqrt(epochs) / s, DELTA)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            low = shuffle_lower_bound(s, 1, epochs, DELTA)
        assert 0.98 * exact <= low <= exact * (1 + 1e-9)


def test_the_poisson_figure_is_below_the_valid_shuffle_epsilon_at_the_same_noise():
    sampling = Sampling("shuffle", REPLACE_ONE, 1438, 128, 11)
    history = [(3.9, 128 / 1438, 22)]
    valid = _accounted(sampling, "pld", 3.9, 22)
    assert epsilon_if_poisson("pld", history, DELTA) < valid / 3


@pytest.mark.parametrize("sampler,accountant", [
    ("shuffle", "pld"), ("shuffle", "rdp"),
    pytest.param("fixed_size", "rdp", marks=pytest.mark.slow)])
def test_calibration_meets_each_samplers_target(sampler, accountant):
    n, batch, steps, target = 1438, 128, 22, 3.0
    sampling = Sampling(sampler, REPLACE_ONE, n, batch, n // batch)
    sigma, used = calibrate_noise_multiplier(target, DELTA, batch / n, steps, accountant,
                                             sampling)
    assert used == accountant
    spent = _accounted(sampling, accountant, sigma, steps)
    assert (1 - RELATIVE_TOLERANCE) * target <= spent <= target


@pytest.mark.parametrize("sampler,relation,accountant,key", [
    ("balls_in_bins", None, "pld", "trainer.sampler"),
    ("fixed_size", None, "pld", "privacy.accountant"),
    ("fixed_size", None, "prv", "privacy.accountant"),
    ("shuffle", ADD_REMOVE, "pld", "privacy.neighbouring"),
    ("fixed_size", ZERO_OUT, "rdp", "privacy.neighbouring"),
    ("poisson", REPLACE_ONE, "rdp", "privacy.accountant"),
    ("poisson", REPLACE_ONE, "prv", "privacy.accountant"),
    ("nope", None, "pld", "trainer.sampler"),
])
def test_combinations_without_a_valid_accountant_are_refused(sampler, relation, accountant,
                                                            key):
    with pytest.raises(ConfigError) as err:
        resolve_sampling(sampler, relation, accountant)
    assert str(err.value).startswith(key) and "\n" not in str(err.value)


def test_every_sampler_has_a_default_relation_it_accepts():
    assert SAMPLERS == ("poisson", "fixed_size", "shuffle")
    assert resolve_sampling("poisson", None, "pld") == ADD_REMOVE
    assert resolve_sampling("fixed_size", None, "rdp") == REPLACE_ONE
    assert resolve_sampling("shuffle", None, "pld") == REPLACE_ONE


def test_a_search_composes_shuffled_runs_as_their_epochs_and_refuses_fixed_size():
    from dpbench.privacy.composition import compose_ledgers
    from dpbench.privacy.ledger import PrivacyLedger, Query

    def ledger(sampling: Sampling, steps: int) -> list[dict]:
        led = PrivacyLedger()
        for _ in range(steps):
            led.record(0.1, [Query("gradient", 1.0, 2.0)], sampling.to_json())
        return led.to_json()

    shuffle = Sampling("shuffle", REPLACE_ONE, 100, 10, 10)
    one = _accounted(shuffle, "pld", 2.0, 20)
    two = compose_ledgers([ledger(shuffle, 20), ledger(shuffle, 20)], DELTA, "pld")
    acc = PrivacyAccountant("pld", shuffle)
    acc.step(2.0, 0.1, count=40)  # four epochs at sigma 2: the two runs' composition
    assert one < two == pytest.approx(acc.get_epsilon(DELTA), rel=1e-9)
    with pytest.raises(ConfigError, match="^trainer.sampler=fixed_size"):
        compose_ledgers([ledger(Sampling("fixed_size", REPLACE_ONE, 100, 10, 10), 5)], DELTA,
                        "rdp")


@pytest.mark.parametrize("sampler,accountant", [("shuffle", "pld"), ("fixed_size", "rdp")])
def test_the_audit_claims_the_samplers_valid_epsilon(sampler, accountant):
    from types import SimpleNamespace

    from dpbench.audit.canaries import planned_epsilon
    from dpbench.privacy.plan import plan_privacy

    privacy = SimpleNamespace(enabled=True, delta=None, noise_multiplier=1.0,
                              target_epsilon=None, accountant=accountant, neighbouring=None)
    trainer = SimpleNamespace(batch_size=100, epochs=2, sampler=sampler)
    plan = plan_privacy(privacy, trainer, 1000, True)
    claimed = planned_epsilon(plan)
    sampling = Sampling(sampler, REPLACE_ONE, 1000, 100, 10)
    assert plan.sampling == sampling
    assert claimed == _accounted(sampling, accountant, 1.0, 20)
    assert plan.delta == DELTA
    assert claimed > epsilon_if_poisson(accountant, [(1.0, 0.1, 20)], DELTA)
