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


def _default_settings():
    """The shipped defaults (conf/audit/one_run.yaml), as the CLI reads them."""
    from omegaconf import OmegaConf

    from dpbench.audit.canaries import AuditSettings
    from dpbench.utils.conf import CONF_DIR

    node = OmegaConf.load(f"{CONF_DIR}/audit/one_run.yaml")
    node.seed = 0
    return AuditSettings(**OmegaConf.to_container(node, resolve=True))


@pytest.mark.parametrize("claimed", [1.0, 3.0, 8.0])
def test_default_audit_power_exceeds_the_claim_up_to_epsilon_8(claimed):
    """The old defaults (1000 canaries, 200 guesses) could certify at most 4.17 at 1e-5."""
    from dpbench.audit.bounds import audit_power

    sized = _default_settings().sized(claimed, 1e-5)
    guesses = sized.guesses_included + sized.guesses_excluded
    assert guesses <= sized.canaries
    power = audit_power(sized.canaries, guesses, 1e-5)
    assert power > claimed  # at claimed 8: power 8.21 (40000 canaries)
    # slack: two wrong guesses still certify more than the claim
    assert epsilon_lower_bound(sized.canaries, guesses, guesses - 2, 1e-5) > claimed


def test_power_is_the_all_correct_bound_and_caps_near_8_at_delta_1e5():
    from dpbench.audit.bounds import audit_power

    assert audit_power(1000, 200, 1e-5) == pytest.approx(4.17, abs=0.01)
    assert audit_power(1000, 200, 1e-5) == epsilon_lower_bound(1000, 200, 200, 1e-5)
    assert max(audit_power(m, m, 1e-5) for m in (10**4, 4 * 10**4, 10**5)) < 8.4
    assert audit_power(40000, 39400, 1e-6) > audit_power(40000, 39400, 1e-5)


def test_fixed_counts_are_kept_and_checked():
    from dpbench.audit.canaries import AuditSettings
    from dpbench.errors import ConfigError

    fixed = AuditSettings(canaries=200, guesses_included=20, guesses_excluded=20)
    assert fixed.sized(8.0, 1e-5) == fixed
    with pytest.raises(ConfigError, match="audit.canaries"):
        AuditSettings(canaries="many")
    assert AuditSettings(guesses_included=40, guesses_excluded=0).sized(1.0, 1e-5).canaries >= 40
