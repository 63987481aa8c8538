"""Every method's reported epsilon against dp-accounting's PLD recomputed from its ledger."""

from __future__ import annotations

import copy
import math

import pytest

from dpbench.privacy.ledger import from_json, run_event, to_json
from dpbench.privacy.verify import event_epsilon
from tests.helpers.config import compose_config, run_config
from tests.helpers.ledger import check_ledger, event_pld, ledger_pld_epsilon
from tests.helpers.method_matrix import is_private, method_mode_params, method_overrides

pytestmark = pytest.mark.privacy_matrix  # make test-privacy


def check_event(summary: dict, cyclic: bool = False) -> None:
    """Assert epsilon re-derived from results.json's DpEvent alone equals the reported one."""
    mechanism = summary["mechanism"]
    event = from_json(mechanism["event"])
    assert to_json(event) == mechanism["event"]  # the JSON form parses back to the same event
    assert event == run_event(summary["privacy_ledger"], summary["private"],
                              mechanism["sampling"])
    assert mechanism["bands"] == summary["participation_bands"]
    assert mechanism["sampling"] == ("cyclic_poisson" if cyclic else "poisson")
    eps = event_epsilon(mechanism["event"], summary["delta"], summary["accountant"] or "pld")
    if math.isinf(summary["epsilon"]):
        assert math.isinf(eps)
        return
    assert eps == pytest.approx(summary["epsilon"], rel=1e-12, abs=1e-12)
    # dp-accounting's generic PLD accountant on the same event: a second path
    # (both PLDs are pure functions of the event and the ledger: computed once per distinct one)
    assert event_pld(mechanism["event"], summary["delta"]) == pytest.approx(
        ledger_pld_epsilon(summary["privacy_ledger"], summary["delta"]), rel=1e-9)


@pytest.mark.parametrize("name,mode", method_mode_params())
def test_reported_epsilon_matches_independent_pld(name, mode, tmp_path):
    summary = run_config(compose_config(*method_overrides(name, mode)), tmp_path)
    check_event(summary, cyclic=name == "bandmf")
    if not is_private(name):
        assert math.isinf(summary["epsilon"]) and summary["privacy_ledger"] == []
        return
    assert summary["grad_sample_mode"] == mode  # the engine that ran is recorded
    eps_pld = check_ledger(summary)
    assert summary["epsilon"] <= summary["target_epsilon"] * 1.01 + 1e-9
    assert eps_pld <= summary["target_epsilon"] * 1.02


@pytest.fixture(scope="session")  # not module: another module's test between its two users
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


@pytest.mark.parametrize("sampler,accountant", [("shuffle", "pld"), ("fixed_size", "rdp")])
def test_a_non_poisson_runs_event_alone_gives_its_reported_epsilon(sampler, accountant,
                                                                     tmp_path):
    summary = run_config(compose_config(
        "method=dpsgd", f"trainer.sampler={sampler}", f"privacy.accountant={accountant}",
        "trainer.epochs=2", "trainer.checkpoint=false"), tmp_path)
    mechanism = summary["mechanism"]
    assert mechanism["sampling"] == sampler and mechanism["neighbouring"] == "replace_one"
    event = from_json(mechanism["event"])
    assert to_json(event) == mechanism["event"]
    assert event == run_event(summary["privacy_ledger"], True, sampler)
    eps = event_epsilon(mechanism["event"], summary["delta"], accountant)
    assert eps == pytest.approx(summary["epsilon"], rel=1e-9)
    # the Poisson reading of the same noise is smaller: the event is not a Poisson event
    assert summary["epsilon_if_poisson"] < eps
