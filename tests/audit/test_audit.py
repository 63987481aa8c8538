"""``dpbench-audit``: epsilon_lower <= claimed for every method; a broken mechanism is caught."""

from __future__ import annotations

import json

import pytest

from dpbench.audit.bounds import epsilon_lower_bound, epsilon_lower_bound_fdp
from dpbench.audit.cli import audit_settings, hydra_main, run_audit
from dpbench.errors import ConfigError
from tests.helpers.audit import audit_config
from tests.helpers.cli import run_cli
from tests.helpers.method_matrix import all_methods, is_private, method_overrides

pytestmark = pytest.mark.privacy_matrix  # make test-privacy

SMALL_AUDIT = ("audit.canaries=200", "audit.guesses_included=20", "audit.guesses_excluded=20")


@pytest.mark.parametrize("name", all_methods())
def test_audit_lower_bound_does_not_exceed_the_claim(name):
    cfg = audit_config(*method_overrides(name), *SMALL_AUDIT)
    if not is_private(name):
        with pytest.raises(ConfigError, match="nothing to audit"):
            run_audit(cfg)
        return
    record = run_audit(cfg)
    assert record["audit"]["guesses"] == 40
    assert 0 <= record["epsilon_lower"] <= record["epsilon_claimed"]
    assert record["epsilon_claimed"] == record["epsilon"] <= 3.0 * 1.01


@pytest.mark.parametrize("broken", ["noise", "clipping"])
def test_audit_detects_a_broken_mechanism(broken):
    """Noise or clipping off while the accountant still claims epsilon ~1: detected."""
    cfg = audit_config(*method_overrides("dpsgd"), "privacy=eps1", "trainer.epochs=2",
                       "audit.canaries=200", "audit.guesses_included=40",
                       "audit.guesses_excluded=0", f"audit.break_mechanism={broken}")
    record = run_audit(cfg)
    assert record["epsilon_claimed"] == pytest.approx(1.0, rel=0.02)
    assert record["epsilon_lower"] > record["epsilon_claimed"]
    assert f"break_mechanism={broken}" in record["broken_on_purpose"]  # marked in the record
    # both bounds, from the same guesses, each with the ceiling of a perfect guesser
    a, delta = record["audit"], record["delta"]
    assert a["ceiling"] == epsilon_lower_bound(200, 40, 40, delta, 0.95)
    assert a["ceiling_fdp"] == epsilon_lower_bound_fdp(200, 40, 40, delta, 0.95)
    assert record["epsilon_lower_fdp"] == epsilon_lower_bound_fdp(200, 40, a["correct"], delta)
    assert record["epsilon_lower_fdp"] >= record["epsilon_lower"]
    assert record["privacy_violation"] and "epsilon_lower" in a["exceeds_claimed"]


def test_audit_honest_twin_of_the_broken_run_stays_below(tmp_path):
    cfg = audit_config(*method_overrides("dpsgd"), "privacy=eps1", "trainer.epochs=2",
                       "audit.canaries=200", "audit.guesses_included=40",
                       "audit.guesses_excluded=0")
    record = run_audit(cfg)
    assert record["epsilon_lower"] <= record["epsilon_claimed"]
    assert "broken_on_purpose" not in record


def test_audit_cli_writes_results_and_prints_the_row(tmp_path, monkeypatch, capfd):
    run_dir = tmp_path / "audit"
    code = run_cli(hydra_main, [*method_overrides("dpsgd"), *SMALL_AUDIT,
                                  f"hydra.run.dir={run_dir}"], monkeypatch)
    assert code == 0
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "completed" and record["kind"] == "audit"
    assert record["epsilon_lower"] <= record["epsilon_claimed"]
    assert "| dpsgd | digits |" in capfd.readouterr().out


def test_audit_cli_rejects_bad_settings_and_leaves_nothing(tmp_path, monkeypatch, capfd):
    run_dir = tmp_path / "audit"
    code = run_cli(hydra_main, [*method_overrides("dpsgd"), "audit.canaries=10",
                                  "audit.guesses_included=8", "audit.guesses_excluded=8",
                                  f"hydra.run.dir={run_dir}"], monkeypatch)
    assert code == 2
    assert "audit.guesses_included + audit.guesses_excluded" in capfd.readouterr().err
    assert not run_dir.exists()


def test_report_lists_epsilon_lower_next_to_the_claim(tmp_path):
    from dpbench.analysis.report import build_report
    from dpbench.logging.records import write_record

    cfg = audit_config(*method_overrides("dpsgd"), *SMALL_AUDIT)
    write_record(tmp_path / "a", run_audit(cfg))
    _, markdown = build_report(tmp_path)
    assert "epsilon_lower" in markdown and "| dpsgd" in markdown


def test_the_broken_mechanism_keeps_the_check_on_and_patches_nothing():
    """The loop has no switch for its sensitivity check: the audit's broken clipping lies to
    it from the audit's own engine wrapper, marked as such (nothing patched at run time)."""
    import inspect
    import sys

    import dpbench.audit.canaries as canaries
    from dpbench.experiment import build_trainer
    from dpbench.training import step

    def namespaces():  # every function and class each loaded dpbench module exposes
        return {(name, key): value for name, module in list(sys.modules.items())
                if name.startswith("dpbench") and module is not None
                for key, value in vars(module).items()
                if inspect.isfunction(value) or inspect.isclass(value)}

    saved = step._check_bound
    before = namespaces()
    for broken, checked in (("clipping", False), ("noise", True), ("none", True)):
        cfg = audit_config(*method_overrides("dpsgd"), *SMALL_AUDIT,
                           f"audit.break_mechanism={broken}")
        trainer = build_trainer(cfg, None,
                                make_trainer=canaries.CanaryRun(audit_settings(cfg)))
        assert trainer.engine.unclipped is not checked  # the audit's wrapper, tests only
        assert trainer.mechanism.clip_factors.__self__ is trainer.mechanism  # no lambda
        # a broken mechanism is a wrapper (audit/broken.py), marked in the method's record
        assert (trainer.method.broken_on_purpose is None) == (broken == "none")
        assert type(trainer.mechanism).__name__.endswith("WithoutNoise") == (broken == "noise")
        assert step._check_bound is saved
        after = namespaces()  # nothing already loaded was replaced (new imports may add)
        assert {k: v for k, v in after.items() if k in before and v is not before[k]} == {}


def test_results_and_row_report_the_audit_power(tmp_path, monkeypatch, capfd):
    from dpbench.audit.bounds import audit_power, reachable_power

    run_dir = tmp_path / "audit"
    assert run_cli(hydra_main, [*method_overrides("dpsgd"), *SMALL_AUDIT,
                                  f"hydra.run.dir={run_dir}"], monkeypatch) == 0
    record = json.loads((run_dir / "results.json").read_text())
    assert record["audit"]["power_if_every_guess_right"] == pytest.approx(
        audit_power(200, 40, record["delta"]))
    assert record["audit_power"] == record["audit"]["power"] == pytest.approx(reachable_power(
        200, 20, 20, record["delta"], 0.95, record["audit"]["unsampled_probability"]))
    out = capfd.readouterr()
    assert "| power |" in out.out and f"| {round(record['audit_power'], 3)} |" in out.out
    assert "cannot detect a mechanism leaking more" in out.err  # 40 guesses: power < 3


@pytest.mark.slow
def test_default_audit_detects_a_broken_mechanism_at_claimed_epsilon_8():
    """Noise off, claim 8: the auto-sized default (40000 canaries) certifies more than 8."""
    cfg = audit_config("method=dpsgd", "dataset=digits", "model=mlp", "privacy=eps8",
                       "audit.break_mechanism=noise")
    record = run_audit(cfg)
    assert record["audit"]["canaries"] == 40000 and record["audit_power"] > 8
    assert record["epsilon_claimed"] == pytest.approx(8.0, rel=0.01)
    assert record["epsilon_lower"] > record["epsilon_claimed"]
