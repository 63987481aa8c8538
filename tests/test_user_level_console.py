"""A sweep across privacy units the way a user runs it: ``dpbench -m privacy.unit=example,user``
from a fresh process outside the repository, then ``dpbench-report`` comparing the units at
equal epsilon (one row per unit, never one cell)."""

from __future__ import annotations

import json

import pytest

from tests.test_console_scripts import QUIET, REPO, _run

pytestmark = [pytest.mark.integration, pytest.mark.processes]


def test_a_sweep_across_units_is_reported_per_unit(tmp_path_factory):
    outside = tmp_path_factory.mktemp("user")
    assert not outside.resolve().is_relative_to(REPO)
    sweep = outside / "units"
    done = _run("dpbench", ["-m", *QUIET, "trainer.batch_size=16", "privacy.unit=example,user",
                            f"hydra.sweep.dir={sweep}"], outside)
    assert "per user (uls, k=8)" in done.stdout
    records = sorted((json.loads(p.read_text()) for p in sweep.glob("*/results.json")),
                     key=lambda r: r["privacy_unit"])
    assert [r["privacy_unit"] for r in records] == ["example", "user"]
    assert records[1]["user_level"]["strategy"] == "uls"
    assert records[1]["dataset_size"] == records[1]["user_level"]["users"]
    _run("dpbench-report", [str(sweep)], outside)
    report = (sweep / "report.md").read_text()
    header = next(line for line in report.splitlines() if line.startswith("| label"))
    assert "| unit" in header
    assert "| example " in report and "| user (uls, k=8) " in report
    assert "Duplicate runs" not in report  # the two units are two cells, not copies


@pytest.mark.parametrize("strategy", ["uls", "els"])
def test_dpbench_audit_plants_canary_users(tmp_path_factory, strategy):
    outside = tmp_path_factory.mktemp("user")
    run = outside / "audit"
    _run("dpbench-audit", ["method=dpsgd", "privacy=eps1", *QUIET, "privacy.unit=user",
                           f"privacy.user_strategy={strategy}", "audit.canaries=100",
                           f"hydra.run.dir={run}"], outside)
    record = json.loads((run / "results.json").read_text())
    assert record["kind"] == "audit" and record["status"] == "completed"
    assert record["privacy_unit"] == "user" and record["user_level"]["strategy"] == strategy
    assert ("canary_users" in record["audit"]) == (strategy == "els")
    assert 0 <= record["epsilon_lower"] <= record["epsilon_claimed"] == record["epsilon"]


def test_dpbench_mia_attacks_whole_users(tmp_path_factory):
    import numpy as np

    outside = tmp_path_factory.mktemp("user")
    run = outside / "mia"
    done = _run("dpbench-mia", ["method=dpsgd", "privacy=eps1", *QUIET, "privacy.unit=user",
                                "mia.pool_size=200", "mia.population_size=30",
                                "mia.references=2", "mia.bootstrap=20", "trainer.batch_size=4",
                                f"hydra.run.dir={run}"], outside)
    assert "| dpsgd | digits |" in done.stdout
    record = json.loads((run / "results.json").read_text())
    assert record["kind"] == "mia" and record["status"] == "completed"
    assert record["privacy_unit"] == "user" and record["mia"]["unit"] == "user"
    users = record["mia"]["pool_users"]["users"]
    with np.load(run / "scores.npz") as saved:  # scores and labels per user, one per pool user
        assert saved["users"].shape == (200,) and saved["users"].max() + 1 == users
        assert saved["scores_rmia"].shape == saved["target_members"].shape == (users,)
        for user in range(users):  # every record of a user on one side
            assert len(set(saved["members"][0][saved["users"] == user].tolist())) == 1
    assert 0 <= record["mia_epsilon_lower"] <= record["epsilon"] <= 1.001
