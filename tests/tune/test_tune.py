"""The tuning protocol: validation split, spawned seeds, accounted epsilon, stored choices."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from omegaconf import OmegaConf

from dpbench.config.compose import compose_config
from dpbench.data import get_dataset_builder
from dpbench.data.base import carve_validation
from dpbench.privacy.composition import compose_ledgers
from dpbench.privacy.selection import exponential_mechanism, search_and_run_epsilon
from dpbench.tune.choices import apply_tuned, cell_key, write_choice
from dpbench.tune.cli import main, train
from dpbench.tune.search import TuneSettings, expand_cells, search_cell, spawn_seeds
from tests.helpers.choice_writer import write_many

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

CELL = ["dataset=digits", "model=logreg", "method=dpsgd", "privacy=eps3", "trainer.epochs=1",
        "trainer.device=cpu"]


def test_validation_split_is_carved_from_train_and_never_touches_test():
    data = get_dataset_builder("digits")()
    carved = carve_validation(data, 0.2)
    assert carved.test.dataset is data.train and carved.train.dataset is data.train
    val, train = set(carved.test.indices), set(carved.train.indices)
    assert not val & train and len(val) + len(train) == len(data.train)
    test_rows = {tuple(x.flatten().tolist()) for x, _ in data.test}
    assert not any(tuple(data.train[i][0].flatten().tolist()) in test_rows for i in val)
    again = carve_validation(data, 0.2)
    assert again.test.indices == carved.test.indices  # fixed, not seed-dependent


def test_trial_seeds_are_distinct_and_reproducible():
    seeds, rng = spawn_seeds(0, 6)
    assert len(set(seeds)) == 6 and spawn_seeds(0, 6)[0] == seeds
    assert spawn_seeds(1, 6)[0] != seeds
    assert rng.random() != np.random.default_rng(seeds[0]).random()


def test_exponential_mechanism_matches_its_distribution():
    rng = np.random.default_rng(0)
    scores, eps, sens = [0.5, 0.6, 0.7], 4.0, 0.1
    draws = np.bincount([exponential_mechanism(scores, eps, sens, rng) for _ in range(20000)],
                        minlength=3) / 20000
    w = np.exp(np.array(scores) * eps / (2 * sens))
    assert draws == pytest.approx(w / w.sum(), abs=0.01)


def test_expand_cells_is_a_cartesian_product():
    cells = expand_cells(["method=a,b", "privacy=eps1,eps3", "x=[1,2]"])
    assert len(cells) == 4 and ["method=a", "privacy=eps1", "x=[1,2]"] in cells


def _composed_by_dp_accounting(ledger, delta: float) -> float:
    """Return epsilon of the ledger's steps, event by event with dp-accounting's PLD accountant
    (independent of dpbench's own PLD composition)."""
    accountant = pld_privacy_accountant.PLDAccountant()
    for e in ledger:
        accountant.compose(dp_event.PoissonSampledDpEvent(
            e["sample_rate"], dp_event.GaussianDpEvent(e["noise_multiplier"])), e["steps"])
    return accountant.get_epsilon(delta)


def test_accounted_search_epsilon_is_the_composition_of_its_trials():
    settings = TuneSettings(lrs=[0.05, 0.5], mode="accounted", selection_epsilon=0.5)
    choice = search_cell(CELL, settings, train)
    assert choice["accountant"] == "pld"
    independent = _composed_by_dp_accounting(choice["search_ledger"], choice["delta"])
    # both are upper bounds on the same composition; their discretisations differ by < 0.1 %
    assert choice["trials_epsilon"] == pytest.approx(independent, rel=1e-3)
    assert choice["search_epsilon"] == pytest.approx(independent, rel=1e-3)  # > selection eps
    trials = compose_ledgers([choice["search_ledger"]], choice["delta"], choice["accountant"])
    assert choice["trials_epsilon"] == pytest.approx(trials)
    steps = [t["steps"] for t in choice["trials"]]
    assert len(steps) == 2 and min(steps) > 0
    assert sum(e["steps"] for e in choice["search_ledger"]) == sum(steps)
    assert trials > max(t["epsilon"] for t in choice["trials"])
    assert all(t["seed"] != 0 for t in choice["trials"])


def test_failed_trial_ledger_is_composed(monkeypatch):
    calls = []

    def flaky(overrides):
        cfg, summary = train(overrides)
        calls.append(summary)
        if len(calls) == 2:
            err = RuntimeError("diverged")
            err.ledger = summary["privacy_ledger"]
            raise err
        return cfg, summary

    choice = search_cell(CELL, TuneSettings(lrs=[0.05, 0.5], mode="accounted",
                                            selection_epsilon=0.5), flaky)
    assert "failed" in choice["trials"][1]
    assert sum(e["steps"] for e in choice["search_ledger"]) == sum(
        e["steps"] for s in calls for e in s["privacy_ledger"])


def test_total_epsilon_covers_trials_selection_and_run():
    ledger = [{"noise_multiplier": 1.0, "sample_rate": 0.05, "steps": 100}]
    total = search_and_run_epsilon(ledger * 3, 1.0, ledger, 2.0, 1e-5, "rdp")
    assert total == pytest.approx(max(compose_ledgers([ledger * 4], 1e-5, "rdp"), 3.0))
    assert search_and_run_epsilon(ledger, 5.0, ledger, 2.0, 1e-5, "rdp") == 7.0


def test_stored_choice_is_applied_to_a_later_run(tmp_path):
    from dpbench.tune.choices import cfg_cell_key

    path = tmp_path / "choices.json"
    key = cfg_cell_key(compose_config(CELL))
    write_choice(path, key, {"key": key, "mode": "unaccounted",
                             "overrides": {"method.optimizer.lr": 0.123}})
    cfg = apply_tuned(compose_config([*CELL, f"tuned={path}"]))
    assert cfg.method.optimizer.lr == 0.123 and cfg.tuning.mode == "unaccounted"
    from dpbench.errors import ConfigError

    with pytest.raises(ConfigError, match="tuned: .* no choice for the cell"):
        apply_tuned(compose_config([*CELL, "privacy=eps8", f"tuned={path}"]))


def test_tune_command_end_to_end(tmp_path, capsys):
    torch.set_num_threads(1)
    out = tmp_path / "tune"
    assert main(["--lrs", "0.05,0.5", "--seeds", "0,1", "--mode", "unaccounted",
                 "--baseline", "dpsgd", "--out", str(out), "--",
                 *CELL[:2], "method=dpsgd,dpadam", *CELL[3:]]) == 0
    text = capsys.readouterr().out
    assert "Tuned learning rates" in text and "verdict" in text
    # one line per finished cell, and the progress over all of them
    assert text.count("dpbench-tune: cell ") == 2 and "chose " in text
    assert "dpbench-tune: 2/4 runs done (50 %)" in text and "4/4 runs done (100 %)" in text
    choices = json.loads((out / "choices.json").read_text())["cells"]
    assert {k.rpartition("|")[0] for k in choices} == {
        cell_key(m, "digits", "logreg", 3.0) for m in ("dpsgd", "dpadam")}
    records = [json.loads(p.read_text()) for p in (out / "runs").rglob("results.json")]
    assert len(records) == 4
    assert all(r["tuning"]["mode"] == "unaccounted" and r["evaluation"]["split"] == "test"
               for r in records)
    assert OmegaConf.create(records[0]["config"]).tuned == str(out / "choices.json")


@pytest.mark.processes  # spawned processes: make test-processes
def test_parallel_cells_match_sequential_cells(tmp_path):
    """--jobs 2 searches cells in two processes: the same choices and test metrics as --jobs 1,
    and both cells' choices survive the concurrent writes to one choices file."""
    torch.set_num_threads(1)
    outs = {}
    for jobs in (1, 2):
        outs[jobs] = tmp_path / f"jobs{jobs}"
        assert main(["--lrs", "0.05,0.5", "--seeds", "0", "--mode", "unaccounted", "--jobs",
                     str(jobs), "--out", str(outs[jobs]), "--", *CELL[:2],
                     "method=dpsgd,dpadam", *CELL[3:]]) == 0
    choices = [json.loads((outs[j] / "choices.json").read_text())["cells"] for j in (1, 2)]
    assert {k.rpartition("|")[0] for k in choices[1]} == {
        cell_key(m, "digits", "logreg", 3.0) for m in ("dpsgd", "dpadam")}
    for key, choice in choices[0].items():
        assert choices[1][key]["overrides"] == choice["overrides"]
        assert [t["score"] for t in choices[1][key]["trials"]] == pytest.approx(
            [t["score"] for t in choice["trials"]], abs=1e-6)

    def metrics(out):
        return {p.parent.name: json.loads(p.read_text())["metrics"]["accuracy"]
                for p in (out / "runs").rglob("results.json")}

    assert metrics(outs[2]) == pytest.approx(metrics(outs[1]), abs=1e-6)


@pytest.mark.processes  # spawned processes: make test-processes
def test_concurrent_choice_writes_keep_every_cell(tmp_path):
    """Writers in separate processes never drop each other's cells (the file is locked)."""
    import multiprocessing

    path = tmp_path / "choices.json"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=write_many, args=(str(path), w)) for w in range(3)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert all(proc.exitcode == 0 for proc in procs)
    cells = json.loads(path.read_text())["cells"]
    assert set(cells) == {f"w{w}-{i}" for w in range(3) for i in range(15)}
