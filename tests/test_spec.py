"""One validation pass, one run path: ``spec.build_spec`` and ``experiment.run``."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from dpbench.config.schema import PrivacyConfig, TrainerConfig
from dpbench.errors import ConfigError
from dpbench.spec import RunSpec, build_spec
from tests.helpers.config import compose_config

PACKAGE = Path(__file__).resolve().parents[1] / "dpbench"
#: the checks of a run's settings (and the typed groups), each called from build_spec alone
RUN_CHECKS = ("check_seed", "check_path_values", "check_logger", "apply_tuned",
              "PrivacyConfig", "TrainerConfig", "check_privacy_matches_method",
              "check_optimizer", "check_method_numbers", "check_dataset", "check_evaluation")


def _callers(name: str) -> list[str]:
    """Return 'module:function' for every call of ``name`` in dpbench, directly or as the
    first argument of a call (``_typed(PrivacyConfig, ...)``)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if not isinstance(node, ast.Call):
                    continue
                called = [node.func, *node.args[:1]]
                if any((isinstance(c, ast.Name) and c.id == name)
                       or (isinstance(c, ast.Attribute) and c.attr == name) for c in called):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{func.name}")
    return sorted(set(found) - {f"dpbench/spec.py:{f}" for f in ("_typed",)})


@pytest.mark.parametrize("name", RUN_CHECKS)
def test_every_check_of_a_run_has_one_caller_build_spec(name):
    assert _callers(name) == ["dpbench/spec.py:build_spec"]


def test_build_spec_returns_the_typed_frozen_settings():
    spec = build_spec(compose_config("method=dpsgd", "trainer.epochs=2", "seed=7"))
    assert isinstance(spec, RunSpec)
    assert isinstance(spec.privacy, PrivacyConfig) and isinstance(spec.trainer, TrainerConfig)
    assert (spec.seed, spec.trainer.epochs, spec.method_name) == (7, 2, "dpsgd")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seed = 8  # type: ignore[misc]


@pytest.mark.parametrize(("override", "key"), [
    ("trainer.epochs=0", "trainer.epochs"),
    ("evaluation.split=train", "evaluation.split"),
    ("method.optimizer.lr=-1", "method.optimizer.lr"),
    ("dataset.train_fraction=1.5", "dataset.train_fraction"),
])
def test_build_spec_refuses_a_bad_setting_naming_its_key_without_reading_data(
        override, key, monkeypatch):
    def no_data(*args, **kwargs):
        raise AssertionError("the data set was loaded")

    monkeypatch.setattr("dpbench.experiment.get_dataset_builder", no_data)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as err:
        build_spec(compose_config("method=dpsgd", override))
    assert "\n" not in str(err.value)


def test_the_audit_sizes_its_canaries_from_the_runs_own_plan_with_bandmfs_bands():
    """The canaries' chance of never being sampled is that of the run's cyclic Poisson
    sampling over b bands, (1 - b q)^(T // b), not Poisson's (1 - q)^T."""
    from dpbench.audit.bounds import unsampled_probability
    from dpbench.audit.canaries import CanaryRun
    from dpbench.audit.cli import audit_settings
    from dpbench.experiment import build_trainer
    from tests.helpers.audit import audit_config

    cfg = audit_config("method=bandmf", "privacy=eps3", "trainer.epochs=1",
                       "audit.canaries=200", "audit.guesses_included=20",
                       "audit.guesses_excluded=20")
    canary_run = CanaryRun(audit_settings(cfg))
    trainer = build_trainer(cfg, None, make_trainer=canary_run)
    plan = trainer.plan
    assert plan.bands == 4
    assert canary_run.canaries.unsampled == unsampled_probability(
        plan.sample_rate, plan.total_steps, plan.bands)
    assert canary_run.canaries.unsampled != unsampled_probability(
        plan.sample_rate, plan.total_steps, 1)


def test_a_dpbench_tune_run_takes_its_folders_lock(tmp_path):
    """A tune run is a job like dpbench's: a folder another run holds is refused."""
    from dpbench.tune.cli import train
    from dpbench.utils.lock import RunDirBusy, RunDirLock

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    held = RunDirLock(run_dir).acquire()
    try:
        with pytest.raises(RunDirBusy):
            train(["method=dpsgd", "trainer.epochs=1"], run_dir)
    finally:
        held.release()
    assert not (run_dir / "results.json").exists()
