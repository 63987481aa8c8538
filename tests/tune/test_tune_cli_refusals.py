"""``dpbench-tune`` checks every option and cell before any work: one line, exit 2, no --out
left behind; it locks --out, and cells that differ anywhere get their own choice and runs."""

from __future__ import annotations

import json
import re

import pytest
import torch

from dpbench.config.compose import compose_config
from dpbench.tune.cli import main
from dpbench.utils.lock import RunDirLock

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

CELL = ["dataset=digits", "model=logreg", "method=dpsgd", "privacy=eps3", "trainer.epochs=1",
        "trainer.device=cpu"]


@pytest.mark.parametrize("options, cell, match", [
    (["--selection-epsilon", "-50"], CELL, "--selection-epsilon must be a finite number > 0"),
    (["--selection-epsilon", "0"], CELL, "--selection-epsilon must be a finite number > 0"),
    (["--selection-epsilon", "nan"], CELL, "--selection-epsilon must be a finite number > 0"),
    (["--selection-epsilon", "inf"], CELL, "--selection-epsilon must be a finite number > 0"),
    (["--lrs", "0.1,-1"], CELL, "--lrs: every learning rate must be a finite number > 0"),
    (["--lrs", "0"], CELL, "--lrs: every learning rate must be a finite number > 0"),
    (["--lrs", "nan"], CELL, "--lrs: every learning rate must be a finite number > 0"),
    (["--lrs", "a,b"], CELL, "--lrs must be comma-separated numbers"),
    (["--lrs", ","], CELL, "--lrs needs at least one learning rate"),
    (["--seeds", ","], CELL, "--seeds needs at least one seed"),
    (["--seeds", "x"], CELL, "--seeds must be comma-separated integers"),
    (["--seeds", "-1"], CELL, "--seeds must be integers >= 0"),
    (["--select", "loss"], CELL, "--select: accounted tuning selects on accuracy"),
    (["--validation-fraction", "1.5"], CELL, "--validation-fraction must be in"),
    ([], [*CELL, "method=nosuchmethod"], "nosuchmethod"),
    ([], [*CELL, "trainer.epochs=abc"], "trainer.epochs"),
    ([], [*CELL[:2], "method=nonprivate", "privacy=nonprivate", *CELL[4:]],
     "--mode accounted: method nonprivate .* is not private"),
    ([], [*CELL, "method.optimizer._target_=torch.load"], "is not an allowed factory"),
    ([], [*CELL, "method.optimizer=null"], "method.optimizer must name an optimiser"),
    ([], [*CELL, "privacy.delta=2"], "privacy.delta"),
    ([], [*CELL, "+dataset.train_subset=50"], "dataset.train_subset: dataset 'digits' has no"),
    ([], [*CELL, "+model.hiden=4"], "model.hiden: model 'logreg' has no setting"),
    ([], [*CELL, "privacy.name=../../x"], "privacy.name='../../x' cannot be part of a folder"),
    ([], [*CELL, "trainer.epochs=1,1"], "are the same run"),
])
def test_bad_options_are_refused_before_any_work(tmp_path, capfd, options, cell, match):
    out = tmp_path / "deep" / "out"
    defaults = [opt for name, value in (("--lrs", "0.1"), ("--seeds", "0"))
                if name not in options for opt in (name, value)]
    code = _main([*defaults, *options, "--out", str(out), "--", *cell])
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("dpbench-tune: error: "), err
    assert re.search(match, err[0]), err[0]
    assert not (tmp_path / "deep").exists()  # nothing created, nothing trained


def _main(argv: list[str]) -> int:
    """Return dpbench-tune's exit code (argparse refusals exit through SystemExit)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def test_a_locked_out_folder_is_refused(tmp_path, capfd):
    out = tmp_path / "out"
    out.mkdir()
    with RunDirLock(out):
        code = _main(["--lrs", "0.1", "--seeds", "0", "--out", str(out), "--", *CELL])
    assert code == 2
    assert "is in use by another dpbench-tune" in capfd.readouterr().err
    assert list(out.iterdir()) == []


def test_an_unwritable_out_folder_is_refused(tmp_path, capfd):
    """--out that cannot be created (its parent is a file: root cannot write there either)."""
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("x")
    code = _main(["--lrs", "0.1", "--seeds", "0", "--out", str(blocker / "out"), "--", *CELL])
    assert code == 2 and "cannot write into --out" in capfd.readouterr().err
    assert blocker.read_text() == "x"


def test_a_stored_hostile_choice_is_refused_before_any_trial(tmp_path, capfd):
    from dpbench.tune.choices import CHOICES_VERSION, cfg_cell_key

    out = tmp_path / "out"
    out.mkdir()
    key = cfg_cell_key(compose_config(["logger=none", "trainer.progress=false",
                                       "trainer.checkpoint=false", *CELL]))
    (out / "choices.json").write_text(json.dumps({"version": CHOICES_VERSION, "cells": {key: {
        "key": key, "mode": "unaccounted",
        "overrides": {"privacy.target_epsilon": 100, "method.optimizer.lr": 0.1}}}}))
    code = main(["--mode", "unaccounted", "--lrs", "0.1", "--seeds", "0", "--out", str(out),
                 "--", *CELL])
    assert code == 2
    assert "overrides.privacy.target_epsilon is not a tunable key" in capfd.readouterr().err
    assert not (out / "runs").exists()


def test_cells_that_differ_in_epochs_get_their_own_choice_and_runs(tmp_path):
    torch.set_num_threads(1)
    out = tmp_path / "out"
    assert main(["--mode", "unaccounted", "--lrs", "0.1", "--seeds", "0", "--out", str(out),
                 "--", *CELL[:4], "trainer.epochs=1,2", "trainer.device=cpu"]) == 0
    cells = json.loads((out / "choices.json").read_text())["cells"]
    assert len(cells) == 2
    records = [json.loads(p.read_text()) for p in (out / "runs").rglob("results.json")]
    assert sorted(r["config"]["trainer"]["epochs"] for r in records) == [1, 2]
    assert not (out / ".dpbench.lock").exists()  # the --out lock is released


def test_an_unwritable_out_folder_is_refused_even_as_root(tmp_path, capfd, monkeypatch):
    import tempfile

    def refuse(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    out = tmp_path / "new" / "out"
    code = _main(["--lrs", "0.1", "--seeds", "0", "--out", str(out), "--", *CELL])
    assert code == 2
    assert "cannot write into --out" in capfd.readouterr().err
    assert not (tmp_path / "new").exists()  # the folders it made are removed again


def test_an_unknown_select_metric_stops_after_the_first_trial(tmp_path, capfd):
    out = tmp_path / "out"
    code = _main(["--mode", "unaccounted", "--select", "no_such_metric", "--lrs", "0.1,0.5",
                  "--seeds", "0", "--out", str(out), "--", *CELL])
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and "--select no_such_metric: the trials report" in err[-1]
    assert "accuracy" in err[-1]
    assert not (out / "choices.json").exists()
