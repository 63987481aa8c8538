"""``dpbench-audit`` under privacy.unit=user: canary USERS (k Dirac records each) give
epsilon_lower within the accounted user-level epsilon, under ULS (a user clipped as one) and
ELS (each record sampled and clipped as an example); a per-user clip (ULS) or a per-user cap
(ELS) broken on purpose is caught."""

from __future__ import annotations

import pytest

from dpbench.audit.cli import run_audit
from dpbench.errors import ConfigError
from tests.helpers.audit import audit_config
from tests.helpers.method_matrix import method_overrides

pytestmark = pytest.mark.privacy_matrix  # make test-privacy

USER_AUDIT = ("privacy=eps1", "trainer.epochs=2", "privacy.unit=user",
              "privacy.max_examples_per_user=64", "audit.canaries=200",
              "audit.guesses_included=40", "audit.guesses_excluded=0")


@pytest.mark.parametrize("broken", ["none", "clipping"])
def test_canary_users_bound_the_user_level_epsilon_and_catch_a_broken_clip(broken):
    record = run_audit(audit_config(*method_overrides("dpsgd"), *USER_AUDIT,
                                    f"audit.break_mechanism={broken}"))
    assert record["privacy_unit"] == "user" and record["user_level"]["strategy"] == "uls"
    assert record["epsilon_claimed"] == record["epsilon"] == pytest.approx(1.0, rel=0.02)
    if broken == "none":
        assert 0 <= record["epsilon_lower"] <= record["epsilon_claimed"]
        assert "broken_on_purpose" not in record
    else:  # each canary user of 64 records contributes 64 C while C is accounted
        assert record["epsilon_lower"] > record["epsilon_claimed"]
        assert "break_mechanism=clipping" in record["broken_on_purpose"]


ELS_AUDIT = ("privacy=eps1", "trainer.epochs=2", "privacy.unit=user",
             "privacy.user_strategy=els", "privacy.max_examples_per_user=8",
             "audit.canaries=200", "audit.guesses_included=40", "audit.guesses_excluded=0")


@pytest.mark.parametrize("broken", ["none", "cap"])
def test_els_canary_users_bound_the_mixture_epsilon_and_catch_a_broken_cap(broken):
    """ELS: each canary user's 8 records are sampled one by one at the example rate and
    clipped as examples (the mixture of Gaussians the accountant composes). Measured:
    honest 26/40 right, epsilon_lower 0.03; the cap broken (64 records a canary user while 8
    are accounted) 39/40 right, epsilon_lower 2.06, against a claimed 1.0."""
    record = run_audit(audit_config(*method_overrides("dpsgd"), *ELS_AUDIT,
                                    f"audit.break_mechanism={broken}"))
    assert record["privacy_unit"] == "user" and record["user_level"]["strategy"] == "els"
    assert record["epsilon_claimed"] == record["epsilon"] == pytest.approx(1.0, rel=0.02)
    rows = record["audit"]["canary_users"]["records"]
    if broken == "none":
        assert rows == 8
        assert 0 <= record["epsilon_lower"] <= record["epsilon_claimed"]
        assert "broken_on_purpose" not in record
    else:
        assert rows == 64
        assert record["epsilon_lower"] > record["epsilon_claimed"]
        assert "break_mechanism=cap" in record["broken_on_purpose"]


def test_a_broken_cap_outside_els_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="privacy.user_strategy=els") as err:
        run_audit(audit_config(*method_overrides("dpsgd"), *USER_AUDIT,
                               "audit.break_mechanism=cap"))
    assert "\n" not in str(err.value)
