"""Files and settings from others (a shared cluster folder, a hostile collaborator): refused in
one line, exit 2, before any training; nothing the run did not create is touched."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from dpbench.cli import hydra_main
from dpbench.errors import ConfigError
from tests.helpers.cli import run_cli

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

BASE = ["dataset=digits", "model=logreg", "method=dpsgd", "privacy=eps3", "trainer.epochs=1"]


def _refused(tmp_path, monkeypatch, capfd, overrides, entry=hydra_main) -> str:
    """Run ``overrides``; assert exit 2, one stderr line, no run folder; return the line."""
    run_dir = tmp_path / "run"
    code = run_cli(entry, [*BASE, *overrides, f"hydra.run.dir={run_dir}"], monkeypatch)
    err = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(err) == 1, err
    assert not run_dir.exists()
    return err[0]


@pytest.mark.parametrize("target", ["torch.load", "joblib.load", "pandas.read_pickle",
                                    "numpy.load", "pathlib.Path.unlink", "builtins.eval",
                                    "os.system", "shutil.rmtree",
                                    "dpbench.utils.io.atomic_write_bytes"])
def test_an_optimizer_target_outside_the_allow_list_is_refused(tmp_path, monkeypatch, capfd,
                                                               target):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    line = _refused(tmp_path, monkeypatch, capfd, [f"method.optimizer._target_={target}",
                                                   f"+method.optimizer.path={victim}"])
    assert f"method.optimizer._target_='{target}' is not an allowed factory" in line
    assert victim.read_text() == "keep me"


def test_a_logger_target_outside_the_allow_list_is_refused(tmp_path, monkeypatch, capfd):
    line = _refused(tmp_path, monkeypatch, capfd, ["logger=wandb",
                                                   "logger._target_=pathlib.Path.unlink"])
    assert "logger._target_='pathlib.Path.unlink' is not an allowed factory" in line


def test_allowed_factories():
    from dpbench.config.targets import check_targets, is_allowed_target

    for target in ("torch.optim.SGD", "torch.optim.Adam", "dpbench.methods.dpadam_bc.AdamBC",
                   "dpbench.logging.wandb_sink.WandbSink"):
        assert is_allowed_target(target), target
    for target in ("torch.optim.lr_scheduler.StepLR", "torch.optim.Optimizer.__init__",
                   "torch.save", "no.such.module.Thing", 3, None):
        assert not is_allowed_target(target), target
    with pytest.raises(ConfigError, match=r"method.optimizer.params\[0\]._target_"):
        check_targets({"_target_": "torch.optim.SGD", "params": [{"_target_": "torch.load"}]},
                      "method.optimizer")


@pytest.mark.parametrize("overrides, match", [
    (["method.optimizer=null"], "method.optimizer must name an optimiser"),
    (["+dataset.train_subset=50"], "dataset.train_subset: dataset 'digits' has no setting"),
    (["model=mlp", "+model.hiden=4"], "model.hiden: model 'mlp' has no setting 'hiden'"),
    (["privacy.delta=1e-300"], "privacy.delta=1e-300 is below 1e-12"),
    (["seed=../../x"], "seed must be an integer"),
    (["logger=wandb", "logger.project=../x"], "logger.project='../x' may not contain"),
    (["trainer.num_threads=100000"], r"trainer.num_threads must be an integer in \[1, \d+\]"),
])
def test_bad_settings_name_their_key(tmp_path, monkeypatch, capfd, overrides, match):
    import re

    line = _refused(tmp_path, monkeypatch, capfd, overrides)
    assert re.search(match, line), line


def test_every_builder_refuses_an_unknown_key():
    from dpbench.data import DATASETS
    from dpbench.models import MODELS

    for registry in (DATASETS, MODELS):
        for name in registry.names():
            builder = registry.get(name)
            with pytest.raises(ConfigError, match=f"{registry.config_group}.no_such_key"):
                if registry is MODELS:
                    builder((1, 8, 8), 10, no_such_key=1)
                else:
                    builder(no_such_key=1)


def test_a_training_run_never_replaces_an_audit_record(tmp_path, monkeypatch, capfd):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record = {"kind": "audit", "status": "completed", "dataset": "digits", "model": "logreg",
              "method": "dpsgd"}
    (run_dir / "results.json").write_text(json.dumps(record))
    code = run_cli(hydra_main, [*BASE, f"hydra.run.dir={run_dir}"], monkeypatch)
    assert code == 2 and "holds a dpbench-audit run" in capfd.readouterr().err
    assert json.loads((run_dir / "results.json").read_text()) == record


# ---------------------------------------------------------------- dpbench-audit folders


def _training_folder(path):
    path.mkdir(parents=True)
    record = {"status": "completed", "dataset": "digits", "model": "logreg", "method": "dpsgd",
              "seed": 0, "metrics": {"accuracy": 0.9}}
    (path / "results.json").write_text(json.dumps(record))
    (path / "config.yaml").write_text("seed: 0\n")
    return record


def test_an_audit_refuses_a_training_run_folder(tmp_path, monkeypatch, capfd):
    from dpbench.audit.cli import hydra_main as audit_entry

    run_dir = tmp_path / "train"
    record = _training_folder(run_dir)
    code = run_cli(audit_entry, [*BASE, "audit.canaries=200", "audit.guesses_included=20",
                                 "audit.guesses_excluded=20", f"hydra.run.dir={run_dir}"],
                   monkeypatch)
    assert code == 2 and "holds another kind of run" in capfd.readouterr().err
    assert json.loads((run_dir / "results.json").read_text()) == record
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml", "results.json"]


def test_an_audit_refuses_a_locked_folder(tmp_path, monkeypatch, capfd):
    from dpbench.audit.cli import hydra_main as audit_entry
    from dpbench.utils.lock import RunDirLock

    run_dir = tmp_path / "audit"
    run_dir.mkdir()
    with RunDirLock(run_dir):
        code = run_cli(audit_entry, [*BASE, "audit.canaries=200", "audit.guesses_included=20",
                                     "audit.guesses_excluded=20", f"hydra.run.dir={run_dir}"],
                       monkeypatch)
    assert code == 2 and "in use by another dpbench run" in capfd.readouterr().err
    assert not (run_dir / "results.json").exists()


# ---------------------------------------------------------------- dpbench-report


def _run_record(seed: int, accuracy: float, **extra) -> dict:
    return {"status": "completed", "dataset": "digits", "model": "logreg", "method": "dpsgd",
            "method_name": "dpsgd", "seed": seed, "target_epsilon": 3.0, "epsilon": 2.99,
            "metrics": {"accuracy": accuracy}, "tuning": {"mode": "default"}, **extra}


def test_report_counts_one_run_per_cell_and_seed(tmp_path):
    from dpbench.analysis.report import build_report

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "results.json").write_text(json.dumps(_run_record(0, 0.9)))
    for i in range(9):  # copies of one run are not nine more seeds
        shutil.copytree(tmp_path / "a", tmp_path / f"copy{i}")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "results.json").write_text(json.dumps(_run_record(1, 0.8)))
    _, markdown = build_report(tmp_path)
    assert "(n=2)" in markdown and "(n=10)" not in markdown and "(n=11)" not in markdown
    assert "Duplicate runs" in markdown and markdown.count("copy") == 9


def test_report_keeps_audit_runs_out_of_the_utility_table(tmp_path):
    from dpbench.analysis.report import build_report

    for seed in (0, 1):
        (tmp_path / f"run{seed}").mkdir()
        (tmp_path / f"run{seed}" / "results.json").write_text(
            json.dumps(_run_record(seed, 0.9)))
    (tmp_path / "audit").mkdir()  # noise off: accuracy 0.1, must not pull the mean down
    (tmp_path / "audit" / "results.json").write_text(json.dumps(_run_record(
        2, 0.1, kind="audit", epsilon_claimed=2.99, epsilon_lower=5.0, audit_power=5.0)))
    _, markdown = build_report(tmp_path)
    table = markdown.split("Empirical audit")[0]
    assert "0.9000 ± 0.0000 (n=2)" in table and "n=3" not in table
    assert "Empirical audit" in markdown


def test_report_refuses_an_unwritable_folder_in_one_line(tmp_path, capfd):
    """The report cannot be written (a folder stands where report.md goes: root cannot write
    it either); one line, exit 2, and the folder in the way is left as it was."""
    from dpbench.analysis.report import main

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "results.json").write_text(json.dumps(_run_record(0, 0.9)))
    (tmp_path / "report.md").mkdir()
    code = main([str(tmp_path)])
    assert code == 2 and "cannot write the report" in capfd.readouterr().err
    assert (tmp_path / "report.md").is_dir()


def test_report_refuses_a_missing_folder(tmp_path, capfd):
    from dpbench.analysis.report import main

    assert main([str(tmp_path / "nothing")]) == 2
    assert "is not a folder" in capfd.readouterr().err


# ---------------------------------------------------------------- bounded reads


@pytest.mark.parametrize("make, match", [
    ("fifo", "not a regular file"), ("device", "not a regular file"),
    ("huge", "bytes, more than"), ("nested", "levels deep"), ("binary", "is not JSON"),
])
def test_read_json_refuses_hostile_files(tmp_path, make, match):
    from dpbench.utils.safe_json import UnsafeFile, read_json

    path = tmp_path / "results.json"
    if make == "fifo":
        os.mkfifo(path)
    elif make == "device":
        path.symlink_to("/dev/zero")
    elif make == "huge":
        with open(path, "wb") as handle:
            handle.truncate(2 * 2**20)
    elif make == "nested":
        path.write_text('{"a": ' * 1000 + "1" + "}" * 1000)
    else:
        path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UnsafeFile, match=match):
        read_json(path, max_bytes=2**20)


def test_json_depth_ignores_brackets_inside_strings():
    from dpbench.utils.safe_json import json_depth

    assert json_depth(b'{"a": "[[[[[[", "b": [1, {"c": "\\"]]]"}]}') == 3


def test_report_write_failure_is_one_line_even_as_root(tmp_path, capfd, monkeypatch):
    """The read-only case without relying on file modes (root ignores them)."""
    import dpbench.analysis.report as report

    def refuse(path, data):
        raise PermissionError(13, "Permission denied", str(path))

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "results.json").write_text(json.dumps(_run_record(0, 0.9)))
    monkeypatch.setattr(report, "atomic_write_bytes", refuse)
    assert report.main([str(tmp_path)]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write the report" in err[0] and "Permission denied" in err[0]


def test_a_planted_lock_link_never_truncates_its_target(tmp_path, monkeypatch, capfd):
    """A collaborator links <run dir>/.dpbench.lock to someone's file: the run refuses the
    folder instead of truncating that file through the link."""
    victim = tmp_path / "thesis.tex"
    victim.write_text("years of work")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".dpbench.lock").symlink_to(victim)
    code = run_cli(hydra_main, [*BASE, f"hydra.run.dir={run_dir}"], monkeypatch)
    assert code == 2 and "is a symbolic link, not a dpbench lock" in capfd.readouterr().err
    assert victim.read_text() == "years of work"


def test_a_planted_choices_lock_link_is_refused(tmp_path):
    from dpbench.tune.choices import write_choice

    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "choices.json.lock").symlink_to(victim)
    with pytest.raises(ConfigError, match="is not a plain file"):
        write_choice(tmp_path / "choices.json", "k", {"key": "k"})
    assert victim.read_text() == "keep" and not (tmp_path / "choices.json").exists()


@pytest.mark.parametrize("make", ["directory"])
def test_a_tuned_path_that_is_a_folder_is_refused(tmp_path, make):
    from dpbench.tune.choices import read_choices

    (tmp_path / "choices.json").mkdir()
    with pytest.raises(ConfigError, match="not a regular file"):
        read_choices(tmp_path / "choices.json")


def test_the_results_loader_reads_shared_folders_bounded(tmp_path):
    """A results.json nested beyond the bound, or a folder in its place, is reported as
    unreadable, never parsed without bound or crashed on."""
    from dpbench.analysis.results import iter_records

    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "results.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "folder" / "results.json").mkdir(parents=True)
    reasons = dict(iter_records(tmp_path))
    assert all(isinstance(v, str) and "unreadable" in v for v in reasons.values())
    assert len(reasons) == 2
