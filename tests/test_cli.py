"""The ``dpbench`` command end to end: results contract, sweeps + report, W&B, bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dpbench.analysis.report import build_report
from dpbench.cli import main
from tests.helpers.results_contract import contract_problems

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

QUIET = ["logger=none", "trainer.progress=false", "trainer.device=cpu"]


def dpbench(monkeypatch, *args: str) -> int:
    """Run the CLI in-process; return its exit code."""
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    monkeypatch.setattr(sys, "argv", ["dpbench", *args])
    try:
        main()
    except SystemExit as exit_:
        return int(exit_.code or 0)
    finally:
        GlobalHydra.instance().clear()
    return 0


def test_single_run_meets_the_results_contract(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert dpbench(monkeypatch, *QUIET, "trainer.epochs=2") == 0
    files = list((tmp_path / "outputs").rglob("results.json"))
    assert len(files) == 1
    record = json.loads(files[0].read_text())
    assert contract_problems(record) == []
    assert record["status"] == "completed" and record["epsilon"] <= record["target_epsilon"]
    assert record["config"]["method"]["name"] == "dpsgd" and record["git_commit"]
    assert record["privacy_ledger"][0]["steps"] == record["steps"]
    assert (files[0].parent / "checkpoint.pt").exists()


def test_sweep_then_report_gives_the_table(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "sweep"
    code = dpbench(monkeypatch, "-m", *QUIET, "method=dpsgd", "privacy=eps1,eps8",
                   "seed=0,1", "trainer.epochs=1", f"hydra.sweep.dir={sweep}")
    assert code == 0
    # the non-private baseline (privacy=nonprivate, chosen by the method) into the same folder
    code = dpbench(monkeypatch, "-m", *QUIET, "method=nonprivate", "seed=0,1",
                   "trainer.epochs=1", f"hydra.sweep.dir={sweep}")
    assert code == 0
    records = [json.loads(p.read_text()) for p in sweep.rglob("results.json")]
    assert len(records) == 6 and all(r["status"] == "completed" for r in records)
    frame, markdown = build_report(sweep)
    assert "eps=1" in markdown and "eps=8" in markdown
    expected = [r["metrics"]["accuracy"] for r in records
                if r["method"] == "dpsgd" and r["target_epsilon"] == 1.0]
    mean = sum(expected) / 2
    table = (sweep / "report.csv").read_text()
    assert f"{mean:.4f}" in table
    for name in ("report.md", "report.tex", "runs.csv", "privacy_utility.png"):
        assert (sweep / name).stat().st_size > 0


def test_failing_sweep_job_does_not_stop_the_others(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "sweep"
    code = dpbench(monkeypatch, "-m", *QUIET, "privacy.target_epsilon=2,-1", "trainer.epochs=1",
                   f"hydra.sweep.dir={sweep}")
    assert code == 0
    records = {r["target_epsilon"]: r for r in
               (json.loads(p.read_text()) for p in sweep.rglob("results.json"))}
    assert records[2.0]["status"] == "completed"
    assert records[-1.0]["status"] == "failed" and "target_epsilon" in records[-1.0]["error"]
    _, markdown = build_report(sweep)
    assert "1 failed" in markdown


def test_wandb_offline_logs_without_account(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["logger=wandb", "trainer.progress=false", "trainer.device=cpu", "trainer.epochs=1"]
    assert dpbench(monkeypatch, *args) == 0
    run_dirs = list((tmp_path / "outputs").rglob("offline-run-*"))
    assert run_dirs and list(run_dirs[0].glob("*.wandb"))


BAD_INPUT = [
    (["privacy.target_epsilon=0"], r"privacy\.target_epsilon must be a number > 0"),
    (["privacy.target_epsilon=-3"], r"privacy\.target_epsilon must be a number > 0"),
    (["privacy.target_epsilon=nan"], r"privacy\.target_epsilon must be a number > 0"),
    (["privacy.delta=0.01"], r"privacy\.delta must be < 1/N"),
    (["privacy.clip_norm=0"], r"privacy\.clip_norm must be a number > 0"),
    (["privacy.accountant=moments"], r"privacy\.accountant must be one of pld, prv, rdp"),
    (["trainer.batch_size=100000"], r"trainer\.batch_size must be <= N = 1438"),
    (["method=no_such_method"], r"method/no_such_method"),
    (["dataset=no_such_data"], r"dataset/no_such_data"),
    (["model=no_such_model"], r"model/no_such_model"),
    (["method=plugin", "method.name=no_such_plugin"], r"unknown method 'no_such_plugin'"),
    (["dataset=mnist", "paths.data_root=/nonexistent/dpbench", "dataset.download=false"],
     r"MNIST not found under /nonexistent/dpbench"),
]


@pytest.mark.parametrize("overrides,message", BAD_INPUT,
                         ids=[" ".join(o) for o, _ in BAD_INPUT])
def test_bad_input_fails_clearly_and_writes_nothing(tmp_path, monkeypatch, capsys, overrides,
                                                    message):
    import re

    monkeypatch.chdir(tmp_path)
    code = dpbench(monkeypatch, *QUIET, *overrides)
    err = capsys.readouterr().err
    assert code != 0
    assert re.search(message, err), err
    leftovers = [p for p in (tmp_path / "outputs").rglob("*")] if (tmp_path / "outputs").exists() \
        else []
    assert leftovers == []


def test_help_lists_groups(monkeypatch, capsys):
    assert dpbench(monkeypatch, "--help") == 0
    out = capsys.readouterr().out
    assert "dpbench" in out and "method:" in out and "privacy:" in out


def test_report_help(capsys):
    from dpbench.analysis.report import main as report_main

    with pytest.raises(SystemExit) as exit_:
        report_main(["--help"])
    assert exit_.value.code == 0 and "method x epsilon" in capsys.readouterr().out


def test_demo_default_needs_no_data_root(tmp_path, monkeypatch):
    monkeypatch.delenv("DPBENCH_DATA_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    assert dpbench(monkeypatch, *QUIET, "trainer.epochs=1") == 0
    assert Path(next((tmp_path / "outputs").rglob("results.json"))).exists()


@pytest.mark.parametrize("override,key", [
    ("privacy.name=../../../../../escaped", "privacy.name"),
    ("method.name=/tmp/escaped", "method.name"),
    ("run_name=..", "run_name"),
])
def test_a_name_with_path_separators_is_refused_and_writes_nothing_outside(
        tmp_path, monkeypatch, capsys, override, key):
    """A group's ``name`` becomes a folder: '../' must neither escape outputs/ nor train."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert dpbench(monkeypatch, *QUIET, "trainer.epochs=1", override) == 2
    err = capsys.readouterr().err
    assert f"{key}=" in err and len(err.strip().splitlines()) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["work"]  # nothing next to work/
    assert not list(work.rglob("results.json")) and not list(work.rglob("*escaped*"))


def test_path_component_makes_any_value_one_folder_name():
    from dpbench.utils.paths import check_inside, path_component

    for value in ("../../x", "/etc/passwd", "..", ".", "a\\..\\b", "a\nb", "x=../y,z=1"):
        name = path_component(value)
        assert "/" not in name and "\\" not in name and name.strip(".") and "\n" not in name
        assert check_inside(Path("outputs/runs") / name, "outputs/runs", "k")
    assert path_component("") == ""  # no overrides: no extra folder level (stays inside)
    assert path_component("dpsgd-digits-mlp-eps3-s0") == "dpsgd-digits-mlp-eps3-s0"
    assert path_component("method.optimizer.lr=0.5,trainer.epochs=1") == (
        "method.optimizer.lr=0.5,trainer.epochs=1")
