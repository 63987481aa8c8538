"""A shared run or tune folder cannot lower the epsilon (docs/reliability-bad-input.md,
"Trust model"): what is resumed is authenticated by the user's MAC key, and every epsilon a
command reports is re-derived from the run's mechanism, never read from a file.

Each numbered case of the threat model has a test here; the property tests edit a real
checkpoint, a real record and a real choices file at random: each edit is refused or yields
the true epsilon, never a smaller one.
"""

from __future__ import annotations

import copy
import json
import math
import shutil

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from dpbench.analysis.results import load_frame, load_records
from dpbench.cli import hydra_main
from dpbench.errors import ConfigError, DataError
from dpbench.logging.records import RESULTS_NAME, write_record
from dpbench.privacy.composition import compose_ledgers
from dpbench.training.checkpoint import CHECKPOINT_NAME, load_checkpoint
from dpbench.training.preemption import Preempted
from dpbench.training.run_state import restore_run_state
from dpbench.tune.choices import CHOICES_VERSION, apply_tuned, cfg_cell_key, write_choice
from dpbench.utils.mac import write_mac
from tests.helpers.choices import CELL, LEDGER
from tests.helpers.choices import accounted_choice as _choice
from tests.helpers.cli import run_cli
from tests.helpers.config import compose_config

pytestmark = pytest.mark.integration  # whole runs or processes: make test, not test-quick

RUN = ["method=dpsgd", "dataset=digits", "model=logreg", "privacy=eps3",
       "trainer.batch_size=256", "trainer.epochs=2"]
STOP_AFTER = 3  # steps before the simulated preemption


def _cli(run_dir, monkeypatch, *extra) -> int:
    return run_cli(hydra_main, [*RUN, *extra, f"hydra.run.dir={run_dir}"], monkeypatch)


# ---- a real checkpoint, preempted mid-epoch ------------------------------------------------

@pytest.fixture(scope="session")  # once per worker, whatever runs between its users
def preempted(tmp_path_factory):
    """Return (run dir, the true epsilon) of a private run preempted after STOP_AFTER steps."""
    from dpbench.experiment import build_trainer

    run_dir = tmp_path_factory.mktemp("preempted")
    trainer = build_trainer(compose_config(*RUN), run_dir)
    with pytest.raises(Preempted):
        trainer.fit(stop=lambda: trainer.step >= STOP_AFTER)
    assert trainer.step == STOP_AFTER and (run_dir / CHECKPOINT_NAME).exists()
    return run_dir, trainer.epsilon()


@pytest.fixture(scope="session")  # once per worker, whatever runs between its users
def resumable(preempted):
    """Return a trainer of the same config, to restore edited states into."""
    from dpbench.experiment import build_trainer

    return build_trainer(compose_config(*RUN, "trainer.resume=true"), None)


def _restored_epsilon(trainer, state) -> float:
    restore_run_state(trainer, state)
    return trainer.epsilon()


def test_an_untouched_checkpoint_resumes_to_its_own_epsilon(preempted, resumable):
    run_dir, true_eps = preempted
    assert _restored_epsilon(resumable, load_checkpoint(run_dir / CHECKPOINT_NAME)) == true_eps


@pytest.mark.parametrize("edit, match", [
    (lambda s: s["ledger"].update(entries=[]), "accounted steps"),  # finding 1: emptied
    (lambda s: [q.update(noise_std=q["noise_std"] * 100)  # finding 1: sigma edited to 100x
                for q in s["ledger"]["entries"][0]["queries"]], "noise multiplier"),
    (lambda s: s.update(step=s["step"] - 2), "step counter"),  # finding 1: moved back
    (lambda s: s.update(step=1, epoch_step=1), "accounted steps"),  # moved back coherently
    (lambda s: s["ledger"]["entries"][0].update(sample_rate=1e-4), "sample_rate"),
])
def test_an_edited_checkpoint_ledger_is_refused_even_with_a_valid_mac(preempted, resumable,
                                                                     edit, match):
    """Finding 1: the ledger is re-derived from the plan and the step counter; an edit made
    by someone holding the key (the MAC verifies) is still refused."""
    state = load_checkpoint(preempted[0] / CHECKPOINT_NAME)
    edit(state)
    with pytest.raises(ConfigError, match=match):
        restore_run_state(resumable, state)


def test_the_checkpoints_accountant_history_is_never_loaded(preempted, resumable):
    state = load_checkpoint(preempted[0] / CHECKPOINT_NAME)
    state["accountant"]["history"] = []  # epsilon 0 if it were loaded
    assert _restored_epsilon(resumable, state) == preempted[1]


def test_a_planted_or_edited_checkpoint_is_refused_at_resume(preempted, tmp_path, monkeypatch,
                                                             capfd):
    """Finding 1 through the command: an edit without the key, or a non-private run's
    checkpoint swapped in (with its own MAC), is refused in one line, exit 2."""
    run_dir = tmp_path / "run"
    shutil.copytree(preempted[0], run_dir)
    state = load_checkpoint(run_dir / CHECKPOINT_NAME)
    state["ledger"]["entries"] = []
    torch.save(state, run_dir / CHECKPOINT_NAME)  # written without the user's key
    assert _cli(run_dir, monkeypatch, "trainer.resume=true") == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "MAC does not match" in err[0] and "start afresh" in err[0]
    (run_dir / (CHECKPOINT_NAME + ".mac")).unlink()
    assert _cli(run_dir, monkeypatch, "trainer.resume=true") == 2
    assert "has no MAC" in capfd.readouterr().err
    # the weights of a non-private run, its checkpoint and MAC copied in whole
    other = tmp_path / "nonprivate"
    from dpbench.experiment import build_trainer

    trainer = build_trainer(compose_config(*RUN, "method=nonprivate", "privacy=nonprivate"), other)
    with pytest.raises(Preempted):
        trainer.fit(stop=lambda: trainer.step >= STOP_AFTER)
    for name in (CHECKPOINT_NAME, CHECKPOINT_NAME + ".mac"):
        shutil.copy(other / name, run_dir / name)
    assert _cli(run_dir, monkeypatch, "trainer.resume=true") == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another configuration" in err[0]
    assert not (run_dir / RESULTS_NAME).exists() or json.loads(
        (run_dir / RESULTS_NAME).read_text())["status"] != "completed"


# ---- a real completed record ---------------------------------------------------------------

@pytest.fixture(scope="session")  # once per worker, whatever runs between its users
def completed(tmp_path_factory):
    """Return the run dir of a completed 1-epoch private run (written by the command)."""
    run_dir = tmp_path_factory.mktemp("completed") / "run"
    mp = pytest.MonkeyPatch()
    try:
        assert _cli(run_dir, mp, "trainer.epochs=1") == 0
    finally:
        mp.undo()
    return run_dir


def _record(run_dir) -> dict:
    return json.loads((run_dir / RESULTS_NAME).read_text())


def test_a_planted_completed_record_is_not_handed_back_at_resume(completed, tmp_path,
                                                                 monkeypatch, capfd):
    """Finding 2: epsilon 0.1 and an edited ledger in a completed record: without the key
    refused by its MAC; with it (re-signed) by its ledger; never 'already completed'."""
    run_dir = tmp_path / "run"
    shutil.copytree(completed, run_dir)
    record = _record(run_dir)
    record["epsilon"] = 0.1
    record["privacy_ledger"][0]["steps"] = 1
    (run_dir / RESULTS_NAME).write_text(json.dumps(record))
    assert _cli(run_dir, monkeypatch, "trainer.epochs=1", "trainer.resume=true") == 2
    err = capfd.readouterr()
    assert "already completed" not in err.out
    assert len(err.err.strip().splitlines()) == 1 and "MAC does not match" in err.err
    write_record(run_dir, record)  # someone with the key: the ledger still decides
    assert _cli(run_dir, monkeypatch, "trainer.epochs=1", "trainer.resume=true") == 2
    err = capfd.readouterr()
    assert "already completed" not in err.out and "privacy_ledger" in err.err
    shutil.copy(completed / RESULTS_NAME, run_dir / RESULTS_NAME)  # the true one resumes
    shutil.copy(completed / (RESULTS_NAME + ".mac"), run_dir / (RESULTS_NAME + ".mac"))
    assert _cli(run_dir, monkeypatch, "trainer.epochs=1", "trainer.resume=true") == 0
    assert "already completed" in capfd.readouterr().out


def test_the_report_refuses_a_record_whose_epsilon_contradicts_its_ledger(completed, tmp_path):
    """Finding 3: the ledger says 2.99, the record says 0.99 with target 1: refused, named,
    not a new eps=1 column."""
    root = tmp_path / "runs"
    for name in ("honest", "planted"):
        shutil.copytree(completed, root / name)
    record = _record(root / "planted")
    record.update(epsilon=0.99, target_epsilon=1.0)
    (root / "planted" / RESULTS_NAME).write_text(json.dumps(record))
    frame = load_frame(root).set_index("run_dir")
    planted = frame.loc[str(root / "planted")]
    assert planted["status"] == "unreadable" and "its ledger gives" in planted["error"]
    honest = frame.loc[str(root / "honest")]
    assert honest["status"] == "completed" and honest["authenticated"] == True  # noqa: E712
    assert [r["epsilon"] for r in load_records(root)] == [_record(completed)["epsilon"]]


def test_a_record_with_a_raised_sigma_and_a_coherent_ledger_is_refused(completed, tmp_path):
    """A lower epsilon made coherent (sigma, ledger and epsilon edited together) still misses
    the target the run was calibrated to."""
    root = tmp_path / "runs"
    shutil.copytree(completed, root / "a")
    record = _record(root / "a")
    record["noise_multiplier"] *= 2
    for entry in record["privacy_ledger"]:
        entry["noise_multiplier"] *= 2
        for q in entry["queries"]:
            q["noise_std"] *= 2
    record["epsilon"] = compose_ledgers([record["privacy_ledger"]], record["delta"], "pld")
    (root / "a" / RESULTS_NAME).write_text(json.dumps(record))
    [row] = load_records(root, status=None, unreadable=True)
    assert row["status"] == "unreadable" and "below its target" in row["error"]


# ---- choices files -------------------------------------------------------------------------

@pytest.fixture(scope="session")  # once per worker, whatever runs between its users
def cell_key() -> str:
    return cfg_cell_key(compose_config(*CELL))


def _apply(path, choice, key):
    path.write_text(json.dumps({"version": CHOICES_VERSION, "cells": {key: choice}}))
    return apply_tuned(compose_config(*CELL, f"tuned={path}"))


def _search_total(cfg) -> float:
    """The search's epsilon a run would account: max(trials composed, selection)."""
    trials = compose_ledgers([list(cfg.tuning.search_ledger)], 1e-5, "pld")
    return max(trials, float(cfg.tuning.selection_epsilon))


def test_a_choices_file_with_emptied_trials_and_a_tiny_selection_is_refused(tmp_path,
                                                                           cell_key):
    """Finding 4: selection 1e-300, trials with epsilon null and 0-step ledgers, the totals
    deleted: refused (before, the search counted nothing but the run)."""
    choice = _choice(cell_key)
    choice["selection_epsilon"] = 1e-300
    with pytest.raises(ConfigError, match="selection_epsilon is 1e-300, below"):
        _apply(tmp_path / "c.json", choice, cell_key)
    choice["selection_epsilon"] = 3.0
    for trial in choice["trials"]:
        trial["epsilon"] = None
        trial["ledger"] = [{**LEDGER[0], "steps": 0}]
    for name in ("search_ledger", "trials_epsilon", "search_epsilon"):
        del choice[name]
    with pytest.raises(ConfigError, match=r"trials\[0\]\.epsilon is missing"):
        _apply(tmp_path / "c.json", choice, cell_key)
    for trial in choice["trials"]:  # the null epsilon restored from the emptied ledger: 0
        trial["epsilon"] = 1e-9
    with pytest.raises(ConfigError, match=r"trials\[0\]\.ledger gives epsilon 0"):
        _apply(tmp_path / "c.json", choice, cell_key)


def test_an_unauthenticated_choices_file_cannot_lower_the_selection_below_the_target(
        tmp_path, cell_key):
    choice = _choice(cell_key)
    choice["selection_epsilon"], choice["search_epsilon"] = 0.5, None
    cfg = _apply(tmp_path / "c.json", choice, cell_key)  # not written with the user's key
    assert cfg.tuning.selection_epsilon == 3.0  # the documented default: the cell's target
    path = tmp_path / "own" / "choices.json"
    path.parent.mkdir()
    write_choice(path, cell_key, choice)  # the user's own --selection-epsilon 0.5
    cfg = apply_tuned(compose_config(*CELL, f"tuned={path}"))
    assert cfg.tuning.selection_epsilon == 0.5


def test_a_choice_switched_to_unaccounted_is_refused(tmp_path, cell_key):
    """Finding 13 (choices part): an accounted search's choice relabelled unaccounted."""
    choice = _choice(cell_key)
    choice["mode"] = "unaccounted"
    with pytest.raises(ConfigError, match="mode is unaccounted, but .* switched"):
        _apply(tmp_path / "c.json", choice, cell_key)


# ---- the tune report and CSV time series ---------------------------------------------------

def test_the_tune_report_keeps_cells_that_differ_in_epochs_apart(tmp_path):
    """Finding 5: ``-- trainer.epochs=1,2`` are two cells, never one row of n=2."""
    from omegaconf import OmegaConf

    from dpbench.tune.cli import report

    for epochs, acc in ((1, 0.5), (2, 0.9)):
        cfg = compose_config(*CELL[:-2], f"trainer.epochs={epochs}", "seed=0")
        folder = tmp_path / "runs" / f"e{epochs}"
        folder.mkdir(parents=True)
        (folder / RESULTS_NAME).write_text(json.dumps({
            "status": "completed", "method": "dpsgd", "method_name": "dpsgd",
            "dataset": "digits", "model": "logreg", "seed": 0, "target_epsilon": 3.0,
            "metrics": {"accuracy": acc}, "tuning": {"mode": "unaccounted"},
            "config": OmegaConf.to_container(cfg, resolve=True)}))
    text = report(tmp_path, "accuracy", None)
    assert "n=2" not in text
    assert text.count("(n=1)") == 2, text


def test_a_csv_time_series_with_inf_is_refused_naming_the_cell(tmp_path):
    """Finding 6: ``inf`` (or a number beyond float32) is not a measurement."""
    from dpbench.data import get_dataset_builder

    rows = ["date,a,b"] + [f"2020-01-01 {h:02d}:00,{h},{'inf' if h == 5 else h}"
                           for h in range(24)]
    (tmp_path / "s.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(DataError, match=r"column 'b' has 1 infinite cell.*data row 6"):
        get_dataset_builder("csv_timeseries")(path=str(tmp_path / "s.csv"), window=4)


# ---- property tests: random edits are refused or give the true epsilon ---------------------

_NO_SHRINK = [Phase.explicit, Phase.generate]  # a failure is reported as found: fast
_SCALE = st.sampled_from([0.0, 0.5, 0.999, 1.001, 2.0, 100.0])
_CKPT_EDITS = st.one_of(
    st.tuples(st.just("ledger_steps"), st.integers(-3, 3)),
    st.tuples(st.just("ledger_sigma"), _SCALE),
    st.tuples(st.just("ledger_noise_std"), _SCALE),
    st.tuples(st.just("ledger_rate"), _SCALE),
    st.tuples(st.just("ledger_drop"), st.just(0)),
    st.tuples(st.just("ledger_dup"), st.just(0)),
    st.tuples(st.just("step"), st.integers(-3, 3)),
    st.tuples(st.just("epoch_step"), st.integers(-3, 3)),
    st.tuples(st.just("epoch"), st.integers(-1, 1)),
    st.tuples(st.just("accountant"), _SCALE),
)


def _edit_checkpoint(state: dict, edit: tuple) -> None:
    kind, value = edit
    entries = state["ledger"]["entries"]
    if kind == "ledger_steps":
        entries[0]["steps"] += value
    elif kind == "ledger_sigma":
        entries[0]["noise_multiplier"] *= value
    elif kind == "ledger_noise_std":
        for q in entries[0]["queries"]:
            q["noise_std"] *= value
    elif kind == "ledger_rate":
        entries[0]["sample_rate"] *= value
    elif kind == "ledger_drop":
        entries.pop()
    elif kind == "ledger_dup":
        entries.append(copy.deepcopy(entries[0]))
    elif kind == "accountant":
        state["accountant"]["history"] = [(s * value, q, n)
                                          for s, q, n in state["accountant"]["history"]]
    else:
        state[kind] += value


@settings(max_examples=12, deadline=None, derandomize=True,
          phases=_NO_SHRINK, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edit=_CKPT_EDITS)
def test_any_edit_of_a_real_checkpoint_is_refused_or_gives_the_true_epsilon(preempted,
                                                                            resumable, edit):
    run_dir, true_eps = preempted
    state = load_checkpoint(run_dir / CHECKPOINT_NAME)
    _edit_checkpoint(state, edit)
    try:
        eps = _restored_epsilon(resumable, state)
    except ConfigError:
        return
    assert eps == true_eps, edit


@settings(max_examples=12, deadline=None, derandomize=True,
          phases=_NO_SHRINK, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(min_size=1, max_size=8), at=st.floats(0, 1))
def test_any_byte_edit_of_a_checkpoint_without_the_key_is_refused(preempted, tmp_path_factory,
                                                                 data, at):
    """Someone without the key (a shared folder): any changed byte fails the MAC."""
    from dpbench.training.run_state import RunCheckpoint
    from dpbench.utils.mac import Unauthenticated

    folder = tmp_path_factory.mktemp("bytes")
    shutil.copy(preempted[0] / (CHECKPOINT_NAME + ".mac"), folder)
    raw = bytearray((preempted[0] / CHECKPOINT_NAME).read_bytes())
    i = int(at * (len(raw) - 1))
    raw[i:i + len(data)] = data
    (folder / CHECKPOINT_NAME).write_bytes(bytes(raw))
    checkpoint = RunCheckpoint(folder, compose_config(*RUN, "trainer.resume=true").trainer)
    if bytes(raw) == (preempted[0] / CHECKPOINT_NAME).read_bytes():
        assert checkpoint.load() is not None
        return
    with pytest.raises(Unauthenticated):
        checkpoint.load()


_RECORD_FIELDS = ["epsilon", "noise_multiplier", "sample_rate", "steps", "delta",
                  "target_epsilon", "participation_bands", "planned_steps",
                  "ledger.steps", "ledger.noise_multiplier", "ledger.sample_rate",
                  "ledger.noise_std", "ledger.drop", "private", "accountant"]


def _edit_record(record: dict, field: str, scale: float) -> None:
    if field == "ledger.drop":
        record["privacy_ledger"] = []
    elif field == "ledger.noise_std":
        for q in record["privacy_ledger"][0]["queries"]:
            q["noise_std"] *= scale
    elif field.startswith("ledger."):
        name = field.partition(".")[2]
        value = record["privacy_ledger"][0][name] * scale
        record["privacy_ledger"][0][name] = int(value) if name == "steps" else value
    elif field == "private":
        record["private"] = False
    elif field == "accountant":
        record["accountant"] = "rdp" if scale > 1 else "gdp"
    elif isinstance(record[field], int) and not isinstance(record[field], bool):
        record[field] = int(record[field] * scale)
    else:
        record[field] = record[field] * scale


@settings(max_examples=15, deadline=None, derandomize=True,
          phases=_NO_SHRINK, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(_RECORD_FIELDS), scale=_SCALE)
def test_any_edit_of_a_real_record_is_refused_or_reports_the_true_epsilon(completed,
                                                                          tmp_path_factory,
                                                                          field, scale):
    true_eps = _record(completed)["epsilon"]
    root = tmp_path_factory.mktemp("records")
    record = _record(completed)
    _edit_record(record, field, scale)
    (root / "a").mkdir()
    (root / "a" / RESULTS_NAME).write_text(json.dumps(record))
    [row] = load_records(root, status=None, unreadable=True)
    if row["status"] == "unreadable":
        return
    eps = row["epsilon"]
    assert eps is None or eps == math.inf or eps >= true_eps * (1 - 1e-9), (field, scale)
    if row.get("private") is not False and eps is not None:
        assert eps == pytest.approx(true_eps, rel=1e-6) or record["epsilon"] >= true_eps


_CHOICE_FIELDS = ["selection_epsilon", "search_epsilon", "trials_epsilon", "trial.epsilon",
                  "trial.epsilon_null",
                  "trial.steps", "trial.ledger.steps", "trial.ledger.noise_multiplier",
                  "trial.ledger.sample_rate", "trial.drop_ledger", "trial.failed", "mode",
                  "delete_totals"]


def _edit_choice(choice: dict, field: str, scale: float) -> None:
    trial = choice["trials"][0]
    if field == "trial.drop_ledger":
        trial["ledger"] = []
    elif field == "trial.epsilon_null":
        trial["epsilon"] = None
    elif field == "trial.failed":
        trial.update(failed="edited", score=None)
    elif field == "mode":
        choice["mode"] = "unaccounted"
    elif field == "delete_totals":
        for name in ("search_ledger", "trials_epsilon", "search_epsilon"):
            choice.pop(name, None)
    elif field.startswith("trial.ledger.") and trial["ledger"]:
        name = field.rpartition(".")[2]
        value = trial["ledger"][0][name] * scale
        trial["ledger"][0][name] = int(value) if name == "steps" else value
    elif field.startswith("trial.") and not field.startswith("trial.ledger."):
        name = field.partition(".")[2]
        trial[name] = int(trial[name] * scale) if name == "steps" else trial[name] * scale
    elif field in choice and choice[field] is not None:
        choice[field] = choice[field] * scale


@settings(max_examples=25, deadline=None, derandomize=True,
          phases=_NO_SHRINK, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.sampled_from(_CHOICE_FIELDS), _SCALE), min_size=1,
                      max_size=4))
def test_any_edit_of_a_choices_file_is_refused_or_keeps_the_search_epsilon(
        tmp_path_factory, cell_key, edits):
    """A choices file is not authenticated (it may be a colleague's): any combination of
    edits is refused or accounts at least the true search epsilon."""
    folder = tmp_path_factory.mktemp("choices")
    true_total = _search_total(_apply(folder / "true.json", _choice(cell_key), cell_key))
    choice = _choice(cell_key)
    for field, scale in edits:
        _edit_choice(choice, field, scale)
    try:
        cfg = _apply(folder / "c.json", choice, cell_key)
    except ConfigError:
        return
    if cfg.tuning.mode == "unaccounted":  # tables say so: nothing is claimed for the search
        return
    # a trial marked failed keeps its steps' ledger: it still composes
    assert _search_total(cfg) >= true_total * (1 - 1e-9), edits


def test_a_mac_sidecar_is_written_beside_what_a_run_writes(completed, preempted):
    for path in (completed / RESULTS_NAME, preempted[0] / CHECKPOINT_NAME):
        assert (path.parent / (path.name + ".mac")).read_text().startswith("hmac-sha256:")


def test_the_mac_key_file_is_created_0600_and_a_loose_one_is_refused(tmp_path, monkeypatch):
    from dpbench.utils.mac import default_key_path, mac_key

    monkeypatch.delenv("DPBENCH_MAC_KEY_FILE")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    key = mac_key()
    path = default_key_path()
    assert path == tmp_path / "config" / "dpbench" / "mac.key"
    assert (path.stat().st_mode & 0o777) == 0o600 and mac_key() == key
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="read or written by others"):
        mac_key()
    monkeypatch.setenv("DPBENCH_MAC_KEY", "k" * 32)
    assert mac_key() == b"k" * 32
    write_mac(tmp_path / "f", b"data")  # a key from the environment signs too
    assert (tmp_path / "f.mac").exists()
