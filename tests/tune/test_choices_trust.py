"""A choices.json from a shared folder is data: it can set only tunable keys, its ledgers are
recomputed, and a hostile or stale file is refused in one line before anything runs."""

from __future__ import annotations

import json
import os

import pytest

from dpbench.config.compose import compose_config
from dpbench.errors import ConfigError
from dpbench.privacy.composition import compose_ledgers
from dpbench.tune.choices import CHOICES_VERSION, apply_tuned, cfg_cell_key, write_choice
from tests.helpers.choices import CELL, LEDGER
from tests.helpers.choices import accounted_choice as _accounted_choice

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

@pytest.fixture(scope="session")  # once per worker, whatever runs between its users
def key() -> str:
    return cfg_cell_key(compose_config(CELL))


def _apply(tmp_path, choice, key, extra=()):
    path = tmp_path / "choices.json"
    path.write_text(json.dumps({"version": CHOICES_VERSION, "cells": {key: choice}}))
    return apply_tuned(compose_config([*CELL, *extra, f"tuned={path}"]))


def test_a_well_formed_accounted_choice_is_applied_with_recomputed_totals(tmp_path, key):
    cfg = _apply(tmp_path, _accounted_choice(key), key)
    assert cfg.method.optimizer.lr == 0.5
    assert len(cfg.tuning.search_ledger) == 2
    assert cfg.tuning.search_epsilon == pytest.approx(
        max(compose_ledgers([LEDGER * 2], 1e-5, "pld"), 3.0))


@pytest.mark.parametrize("name, value, match", [
    ("method.optimizer._target_", "pandas.read_pickle", "not a tunable key"),
    ("method.optimizer", {"_target_": "torch.load", "f": "x"}, "not a tunable key"),
    ("privacy.target_epsilon", 100, "not a tunable key"),
    ("privacy.clip_norm", 1e-9, "not a tunable key"),
    ("trainer.epochs", 100, "not a tunable key"),
    ("paths.output_root", "/", "not a tunable key"),
    ("method.optimizer.lr", -1.0, "finite number > 0"),
    ("method.optimizer.lr", "0.1", "must be a number"),
    ("method.optimizer.lr", float("inf"), "finite number > 0"),
    ("trainer.batch_size", 0, "integer >= 1"),
    ("trainer.batch_size", 2.5, "integer >= 1"),
    ("method.settings.clip_floor", -1.0, "finite number >= 0"),
    ("method.settings.clip_floor", 0.1, "is not a setting of this cell"),  # dpsgd has none
])
def test_a_choice_sets_only_tunable_keys_each_checked(tmp_path, key, name, value, match):
    choice = _accounted_choice(key)
    choice["overrides"] = {"method.optimizer.lr": 0.5, name: value} if name != (
        "method.optimizer.lr") else {name: value}
    with pytest.raises(ConfigError, match=f"tuned: .*cell .*overrides.*{match}") as err:
        _apply(tmp_path, choice, key)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.update(search_ledger=[]), "search_ledger differs from the trials"),
    (lambda c: [t.update(ledger=[]) for t in c["trials"]], "trials\\[0\\].ledger gives epsilon"),
    (lambda c: c.update(selection_epsilon=0), "selection_epsilon must be a finite number > 0"),
    (lambda c: c.update(selection_epsilon=-50), "selection_epsilon must be a finite number > 0"),
    (lambda c: c.update(trials_epsilon=0.1), "trials_epsilon is 0.1 but"),
    (lambda c: c.update(search_epsilon=0.1), "search_epsilon is 0.1 but"),
    (lambda c: c["trials"][0]["ledger"][0].update(noise_multiplier=1e9),
     "trials\\[0\\].ledger gives epsilon"),
    (lambda c: c["trials"][0]["ledger"][0].update(steps=-3), "steps must be an integer"),
    (lambda c: c.update(trials=[]), "trials must list"),
    (lambda c: c.update(delta=2), "delta must be in"),
    (lambda c: c.update(mode="free"), "mode must be one of"),
])
def test_an_edited_ledger_is_refused(tmp_path, key, edit, match):
    choice = _accounted_choice(key)
    edit(choice)
    with pytest.raises(ConfigError, match=match):
        _apply(tmp_path, choice, key)


def test_the_total_is_recomputed_from_the_trials_not_the_file(tmp_path, key):
    """search_ledger dropped from the file (not emptied): the trials' ledgers still count."""
    choice = _accounted_choice(key)
    del choice["search_ledger"], choice["trials_epsilon"], choice["search_epsilon"]
    cfg = _apply(tmp_path, choice, key)
    assert sum(e["steps"] for e in cfg.tuning.search_ledger) == 40


def test_a_file_of_another_version_or_cell_is_refused(tmp_path, key):
    path = tmp_path / "choices.json"
    path.write_text(json.dumps({"cells": {key: _accounted_choice(key)}}))
    with pytest.raises(ConfigError, match=f"tuned: {path} has version=None"):
        apply_tuned(compose_config([*CELL, f"tuned={path}"]))
    other = _accounted_choice(key)
    other["key"] = "dpsgd|digits|logreg|eps=8|run=000000000000"
    with pytest.raises(ConfigError, match="key is .*made for another cell"):
        _apply(tmp_path, other, key)


def test_cells_differing_outside_the_readable_key_get_their_own_key():
    base = cfg_cell_key(compose_config(CELL))
    assert cfg_cell_key(compose_config([*CELL, "trainer.epochs=3"])) != base
    assert cfg_cell_key(compose_config([*CELL, "trainer.batch_size=32"])) != base
    assert cfg_cell_key(compose_config([*CELL, "privacy.clip_norm=0.5"])) != base
    # what a search changes per trial, and what does not change a run, keep the key
    for same in ("seed=7", "method.optimizer.lr=0.3", "evaluation.split=validation",
                 "logger=none", "trainer.progress=false", "trainer.checkpoint=false"):
        assert cfg_cell_key(compose_config([*CELL, same])) == base, same


@pytest.mark.parametrize("make", ["fifo", "huge", "nested", "device"])
def test_a_hostile_choices_file_is_refused_unread(tmp_path, make):
    path = tmp_path / "choices.json"
    if make == "fifo":
        os.mkfifo(path)  # reading would block forever
    elif make == "huge":
        with open(path, "wb") as handle:
            handle.truncate(17 * 2**20)
    elif make == "nested":
        path.write_text("[" * 100000 + "]" * 100000)
    else:
        path.symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match="tuned: .*(not a regular file|bytes, more than|"
                                          "levels deep)") as err:
        apply_tuned(compose_config([*CELL, f"tuned={path}"]))
    assert "\n" not in str(err.value)


def test_write_choice_stamps_the_version(tmp_path, key):
    path = tmp_path / "choices.json"
    write_choice(path, key, _accounted_choice(key))
    assert json.loads(path.read_text())["version"] == CHOICES_VERSION
    assert apply_tuned(compose_config([*CELL, f"tuned={path}"])).method.optimizer.lr == 0.5


def test_the_dpbench_command_refuses_a_hostile_choice_before_any_work(tmp_path, monkeypatch,
                                                                       capfd, key):
    """The reported attack: an optimiser _target_ in a shared choices file. Exit 2, one line,
    nothing run and no run folder left."""
    from dpbench.cli import hydra_main
    from tests.helpers.cli import run_cli

    marker = tmp_path / "pwned"
    choice = _accounted_choice(key)
    choice["overrides"]["method.optimizer"] = {"_target_": "pathlib.Path.touch",
                                               "self": str(marker)}
    path = tmp_path / "choices.json"
    path.write_text(json.dumps({"version": CHOICES_VERSION, "cells": {key: choice}}))
    run_dir = tmp_path / "run"
    code = run_cli(hydra_main, [*CELL, f"tuned={path}", f"hydra.run.dir={run_dir}"],
                   monkeypatch)
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and not marker.exists() and not run_dir.exists()
    assert len(err) == 1 and "overrides.method.optimizer is not a tunable key" in err[0]


def test_a_choice_with_too_many_trials_or_ledger_entries_is_refused_before_accounting(tmp_path,
                                                                                      key):
    many_trials = _accounted_choice(key)
    many_trials["trials"] = many_trials["trials"] * 600
    with pytest.raises(ConfigError, match="trials has 1200 entries"):
        _apply(tmp_path, many_trials, key)
    long_ledger = _accounted_choice(key)
    long_ledger["trials"][0]["ledger"] = LEDGER * 1001
    with pytest.raises(ConfigError, match=r"trials\[0\].ledger has 1001 entries"):
        _apply(tmp_path, long_ledger, key)
