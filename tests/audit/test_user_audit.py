"""``dpbench-audit`` under privacy.unit=user (ULS): canary USERS (k Dirac records each,
clipped as one user) give epsilon_lower within the accounted user-level epsilon, and a
per-user clip broken on purpose (examples clipped, then summed) is caught."""

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


def test_an_els_audit_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="privacy.user_strategy=uls") as err:
        run_audit(audit_config(*method_overrides("dpsgd"), *USER_AUDIT,
                               "privacy.user_strategy=els"))
    assert "\n" not in str(err.value)
