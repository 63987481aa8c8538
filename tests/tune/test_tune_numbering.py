"""dpbench-tune keeps every earlier run where it was when seeds or trials are added or a tune
is resumed: its final runs' folders are named by the cell and the seed (never by a job
number, which Hydra gives a multirun's jobs by their position in the product of the
overrides), and its trials are drawn from streams indexed by trial."""

from __future__ import annotations

from pathlib import Path

from dpbench.tune import cli
from dpbench.tune.choices import write_choice
from dpbench.tune.search import sample_trials, spawn_seeds

CELL = ["dataset=digits", "model=logreg", "method=dpsgd", "privacy=eps3", "trainer.epochs=1",
        "trainer.device=cpu"]


def _key() -> str:
    from dpbench.config.compose import compose_config
    from dpbench.tune.choices import cfg_cell_key

    return cfg_cell_key(compose_config(["logger=none", "trainer.progress=false", *CELL]))


def _folders(tmp_path: Path, monkeypatch, seeds: list[int]) -> dict[str, Path]:
    """The folder of each seed's final run when ``dpbench-tune --seeds SEEDS`` (resumed on
    the same --out) trains the cell; the search and the training are stand-ins."""
    seen: dict[str, Path] = {}

    def search(cell, settings, run):
        return {"key": _key(), "mode": "unaccounted", "overrides": {"method.optimizer.lr": 0.1}}

    def train(overrides, run_dir=None):
        seen[next(o for o in overrides if o.startswith("seed="))] = run_dir
        return None, {}

    monkeypatch.setattr(cli, "search_cell", search)
    monkeypatch.setattr(cli, "train", train)
    job = cli.make_job(CELL, out=tmp_path, seeds=seeds, mode="unaccounted", lrs=[0.1])
    cli.run_cell(CELL, job)
    return seen


def test_added_seeds_leave_the_earlier_runs_in_their_folders(tmp_path, monkeypatch):
    first = _folders(tmp_path, monkeypatch, [0, 1, 2])
    # the choice is stored now: the resumed tune reuses it and only adds seeds 3 and 4
    later = _folders(tmp_path, monkeypatch, [0, 1, 2, 3, 4])
    assert {s: later[s] for s in first} == first
    assert len(set(later.values())) == 5
    # appended seeds first or last, one folder per seed all the same
    assert _folders(tmp_path, monkeypatch, [4, 3, 2, 1, 0]) == later


def test_added_trials_leave_the_earlier_trials_as_they_were():
    few, more = sample_trials(4, 9, (0.01, 1.0), [64, 128]), sample_trials(9, 9, (0.01, 1.0),
                                                                            [64, 128])
    assert more[:4] == few
    assert spawn_seeds(9, 9)[0][:4] == spawn_seeds(9, 4)[0]


def test_a_stored_choice_is_reused_not_searched_again(tmp_path, monkeypatch):
    key = _key()
    write_choice(tmp_path / "choices.json", key, {
        "key": key, "mode": "unaccounted", "overrides": {"method.optimizer.lr": 0.3}})

    def search(cell, settings, run):
        raise AssertionError("searched again")

    monkeypatch.setattr(cli, "search_cell", search)
    monkeypatch.setattr(cli, "train", lambda overrides, run_dir=None: (None, {}))
    job = cli.make_job(CELL, out=tmp_path, seeds=[0, 5], mode="unaccounted", lrs=[0.1])
    assert "chose {'method.optimizer.lr': 0.3}" in cli.run_cell(CELL, job)
