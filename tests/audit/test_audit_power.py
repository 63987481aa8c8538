"""The audit's stated power is what it can certify: with the noise off, epsilon_lower reaches
at least 0.8 of it at the default settings, in short runs too, where Poisson sampling leaves
many included canaries out of every step."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dpbench.audit.bounds import (
    audit_power,
    auto_guess_counts,
    expected_wrong_guesses,
    reachable_power,
    unsampled_probability,
)
from dpbench.audit.cli import hydra_main, run_audit
from tests.helpers.audit import audit_config
from tests.helpers.cli import run_cli

pytestmark = pytest.mark.privacy_matrix  # make test-privacy

DEFAULT_RUN = ("method=dpsgd", "dataset=digits", "model=mlp")


@pytest.mark.parametrize("epochs", [1, 2])
def test_noise_off_reaches_the_stated_power_in_short_runs(epochs):
    """Default (auto) audit, claim 3: a mechanism without noise is certified at >= 0.8 of the
    stated power, which must exceed the claim (the broken run is caught)."""
    cfg = audit_config(*DEFAULT_RUN, "privacy=eps3", f"trainer.epochs={epochs}",
                       "audit.break_mechanism=noise")
    record = run_audit(cfg)
    audit = record["audit"]
    assert audit["epsilon_lower"] >= 0.8 * audit["power"]
    assert audit["power"] > record["epsilon_claimed"]
    assert record["epsilon_lower"] > record["epsilon_claimed"]
    assert audit["unsampled_probability"] == pytest.approx(math.exp(-epochs), rel=0.15)


@pytest.mark.slow
@pytest.mark.parametrize("epochs", [1, 2])
def test_noise_off_reaches_the_stated_power_at_claim_8(epochs):
    """The reported case (privacy=eps8 trainer.epochs=2): the stated power is reachable; it is
    below the claim there, and the audit says so rather than stating 8.21."""
    cfg = audit_config(*DEFAULT_RUN, "privacy=eps8", f"trainer.epochs={epochs}",
                       "audit.break_mechanism=noise")
    audit = run_audit(cfg)["audit"]
    assert audit["epsilon_lower"] >= 0.8 * audit["power"]


def test_the_honest_short_run_stays_below_its_claim():
    cfg = audit_config(*DEFAULT_RUN, "privacy=eps3", "trainer.epochs=1")
    record = run_audit(cfg)
    assert record["epsilon_lower"] <= record["epsilon_claimed"]


def test_unsampled_probability_matches_the_canary_sampler():
    """(1 - q)^T, and with b bands (1 - b q)^(T // b), against a simulation of the audit's
    own sampling rule (cyclic Poisson: canary i only on steps with step % b == i % b)."""
    rng = np.random.default_rng(0)
    for q, steps, bands in ((0.09, 11, 1), (0.09, 22, 1), (0.05, 40, 4)):
        m = 20000
        seen = np.zeros(m, dtype=bool)
        for step in range(steps):
            sampled = rng.random(m) < bands * q
            if bands > 1:
                sampled &= np.arange(m) % bands == step % bands
            seen |= sampled
        assert (~seen).mean() == pytest.approx(unsampled_probability(q, steps, bands), abs=0.01)


def test_expected_wrong_guesses_match_a_noise_free_simulation():
    """With the noise off, scores are > 0 exactly for the sampled included canaries; the
    guesses are the top k+ and bottom k- (ties in a random order)."""
    rng = np.random.default_rng(1)
    m, p = 2000, 0.3
    k_in, k_out = 500, 400
    wrong = []
    for _ in range(200):
        included = rng.random(m) < 0.5
        score = (included & (rng.random(m) >= p)).astype(float)
        order = np.lexsort((rng.random(m), -score))  # descending score, random ties
        top, bottom = order[:k_in], order[m - k_out:]
        wrong.append(int((~included[top]).sum() + included[bottom].sum()))
    assert np.mean(wrong) == pytest.approx(expected_wrong_guesses(m, k_in, k_out, p), rel=0.1)


def test_stated_power_never_exceeds_every_guess_right_and_drops_bottom_guesses_when_short():
    delta = 1e-5
    for p in (0.0, 0.01, 0.14, 0.37):
        k_in, k_out = auto_guess_counts(1000, delta, 0.95, p)
        power = reachable_power(1000, k_in, k_out, delta, 0.95, p)
        assert power <= audit_power(1000, k_in + k_out, delta) + 1e-12
        if p == 0.0:
            assert k_out > 0  # a long run guesses both sides
        if p > 0.1:
            assert k_out == 0  # a short run guesses only the included side
    assert reachable_power(1000, 452, 452, delta, 0.95, 0.0) == audit_power(1000, 904, delta)


def test_the_record_states_power_and_its_basis(tmp_path, monkeypatch):
    run_dir = tmp_path / "audit"
    assert run_cli(hydra_main, [*DEFAULT_RUN, "trainer.epochs=1", "audit.canaries=200",
                                  "audit.guesses_included=20", "audit.guesses_excluded=20",
                                  f"hydra.run.dir={run_dir}"], monkeypatch) == 0
    audit = json.loads((run_dir / "results.json").read_text())["audit"]
    assert audit["power"] <= audit["power_if_every_guess_right"]
    assert audit["power"] == pytest.approx(reachable_power(
        200, 20, 20, json.loads((run_dir / "results.json").read_text())["delta"], 0.95,
        audit["unsampled_probability"]))
