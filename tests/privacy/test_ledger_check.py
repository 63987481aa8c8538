"""Every method's reported epsilon against dp-accounting's PLD recomputed from its ledger."""

from __future__ import annotations

import copy
import math

import pytest

from tests.helpers.config import compose_config, run_config
from tests.helpers.ledger import check_ledger
from tests.helpers.method_matrix import is_private, method_mode_params, method_overrides

pytestmark = pytest.mark.privacy_matrix  # make test-privacy


@pytest.mark.parametrize("name,mode", method_mode_params())
def test_reported_epsilon_matches_independent_pld(name, mode, tmp_path):
    summary = run_config(compose_config(*method_overrides(name, mode)), tmp_path)
    if not is_private(name):
        assert math.isinf(summary["epsilon"]) and summary["privacy_ledger"] == []
        return
    assert summary["grad_sample_mode"] == mode  # the engine that ran is recorded
    eps_pld = check_ledger(summary)
    assert summary["epsilon"] <= summary["target_epsilon"] * 1.01 + 1e-9
    assert eps_pld <= summary["target_epsilon"] * 1.02


@pytest.fixture(scope="module")
def dpsgd_summary(tmp_path_factory) -> dict:
    """One tiny DP-SGD run; each negative control corrupts its own copy of the summary."""
    summary = run_config(compose_config(*method_overrides("dpsgd")),
                         tmp_path_factory.mktemp("dpsgd"))
    check_ledger(copy.deepcopy(summary))  # the honest ledger passes
    return summary


@pytest.mark.xdist_group("ledger_dpsgd")  # --dist loadgroup: one worker runs it once
def test_ledger_check_catches_a_missing_step(dpsgd_summary):
    """Negative control: a ledger that hides one step's release fails the check."""
    summary = copy.deepcopy(dpsgd_summary)
    summary["privacy_ledger"][0]["steps"] -= 1
    with pytest.raises(AssertionError):
        check_ledger(summary)


@pytest.mark.xdist_group("ledger_dpsgd")
def test_ledger_check_catches_an_understated_noise(dpsgd_summary):
    """Negative control: an accountant told a larger sigma than was released under-reports."""
    summary = copy.deepcopy(dpsgd_summary)
    for q in summary["privacy_ledger"][0]["queries"]:
        q["noise_std"] *= 0.5  # what was really released: half the noise
    with pytest.raises(AssertionError):
        check_ledger(summary)
