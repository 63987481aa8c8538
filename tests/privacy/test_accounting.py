"""Calibration hits the target, delta defaults follow the spec, accountant state round-trips."""

from __future__ import annotations

import math

import pytest

from dpbench.privacy import PrivacyAccountant, calibrate_noise_multiplier, default_delta
from dpbench.privacy.ledger import PrivacyLedger, Query, combined_noise_multiplier
from tests.helpers.config import compose_config, run_config


@pytest.mark.parametrize("n,expected", [(1438, 1e-5), (60000, 1e-5), (50, 1e-5), (99999, 1e-5),
                                        (100000, 1e-6), (200000, 1e-6), (1_000_000, 1e-7),
                                        (1_000_001, 1e-7)])
def test_default_delta(n, expected):
    """min(1e-5, 1/N') with N' the smallest power of ten above N."""
    above = 10 ** (math.floor(math.log10(n)) + 1)
    assert default_delta(n) == pytest.approx(min(1e-5, 1 / above))
    assert default_delta(n) == pytest.approx(expected)


@pytest.mark.parametrize("accountant", ["pld", "prv", "rdp"])
@pytest.mark.parametrize("eps", [1.0, 3.0, 8.0])
def test_calibrated_sigma_spends_at_most_target_and_within_5pct(accountant, eps):
    q, steps, delta = 0.05, 200, 1e-5
    sigma, used = calibrate_noise_multiplier(eps, delta, q, steps, accountant)
    acc = PrivacyAccountant(used)
    for _ in range(steps):
        acc.step(sigma, q)
    spent = acc.get_epsilon(delta)
    assert spent <= eps
    assert spent >= 0.95 * eps


def test_end_to_end_epsilon_within_target(tmp_path):
    result = run_config(compose_config("trainer.epochs=2", "privacy=eps1"), tmp_path)
    assert 0.95 <= result["epsilon"] <= 1.0
    assert result["steps"] == result["planned_steps"]


@pytest.mark.parametrize("accountant", ["pld", "prv", "rdp"])
def test_accountant_state_round_trip(accountant):
    a = PrivacyAccountant(accountant)
    for _ in range(30):
        a.step(1.1, 0.02)
    b = PrivacyAccountant(accountant)
    b.load_state_dict(a.state_dict())
    assert b.get_epsilon(1e-5) == a.get_epsilon(1e-5)
    assert b.steps == 30


def test_combined_multiplier_of_split_queries():
    """A gradient with sigma_delta and a count with sensitivity 1/2 and noise sigma_b compose
    to sigma exactly when sigma_delta = (sigma^-2 - (2 sigma_b)^-2)^-1/2 (Andrew et al. Thm 1)."""
    sigma, sigma_b = 1.3, 5.0
    sigma_delta = (sigma**-2 - (2 * sigma_b) ** -2) ** -0.5
    qs = [Query("gradient", 2.0, sigma_delta * 2.0), Query("count", 0.5, sigma_b)]
    assert combined_noise_multiplier(qs) == pytest.approx(sigma, rel=1e-12)


def test_ledger_compresses_identical_steps():
    ledger = PrivacyLedger()
    for _ in range(5):
        ledger.record(0.1, [Query("gradient", 1.0, 1.2)])
    ledger.record(0.1, [Query("gradient", 1.0, 2.0)])
    assert [e["steps"] for e in ledger.to_json()] == [5, 1] and ledger.steps == 6
