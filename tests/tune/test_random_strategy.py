"""dpbench-tune's random strategy: trials drawn in advance from the run's seed streams, the same
choice record as the grid, and a search epsilon that composes every trial."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dpbench.config.compose import compose_config
from dpbench.privacy.composition import compose_ledgers
from dpbench.training.loop import Trainer
from dpbench.tune.cli import main, train
from dpbench.tune.search import (
    BATCH_SIZE,
    CLIP_FLOOR,
    LR,
    TuneSettings,
    sample_trials,
    search_cell,
    spawn_seeds,
)
from dpbench.utils.seeding import stream_seed

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

CELL = ["dataset=digits", "model=logreg", "method=dpsgd", "privacy=eps3", "trainer.epochs=1",
        "trainer.device=cpu"]
RANDOM = {"strategy": "random", "trials": 4, "lr_range": (0.05, 2.0),
          "batch_sizes": [50, 100, 200]}


def _fake_run(fail_at: int | None = None):
    """Return a ``run`` that trains nothing: its score depends on the trial's overrides, its
    ledger on the batch size; trial ``fail_at`` raises after releasing its steps."""
    cfg = compose_config(["logger=none", "trainer.progress=false", *CELL])
    calls: list[list[str]] = []

    def run(overrides):
        calls.append(overrides)
        values = dict(o.split("=", 1) for o in overrides)
        lr, batch = float(values[LR]), int(values.get(BATCH_SIZE, 128))
        ledger = [{"noise_multiplier": 1.0, "sample_rate": batch / 1000, "steps": 10}]
        if len(calls) - 1 == fail_at:
            err = RuntimeError("diverged")
            err.ledger = ledger
            raise err
        return cfg, {"metrics": {"accuracy": 1.0 / (1.0 + abs(np.log(lr)))},
                     "epsilon": compose_ledgers([ledger], 1e-5, "rdp"), "delta": 1e-5,
                     "accountant": "rdp", "evaluated_examples": 200, "steps": 10,
                     "privacy_ledger": ledger}

    return run, calls


def test_random_trials_are_reproducible_from_the_seed_and_distinct():
    a = sample_trials(30, 3, (0.01, 1.0), [64, 128], [0.0, 0.1])
    assert a == sample_trials(30, 3, (0.01, 1.0), [64, 128], [0.0, 0.1])
    assert a != sample_trials(30, 4, (0.01, 1.0), [64, 128], [0.0, 0.1])
    assert len({t[LR] for t in a}) == 30  # continuous draws: no two trials share a rate
    assert all(0.01 <= t[LR] <= 1.0 for t in a)
    assert {t[BATCH_SIZE] for t in a} == {64, 128}
    assert {t[CLIP_FLOOR] for t in a} == {0.0, 0.1}
    # the clip floor has a stream of its own: cells with and without floors share (lr, B)
    without = sample_trials(30, 3, (0.01, 1.0), [64, 128])
    assert [{k: v for k, v in t.items() if k != CLIP_FLOOR} for t in a] == without


def test_trial_seeds_come_from_the_run_seed_streams():
    seeds, selection = spawn_seeds(7, 50)
    assert seeds == [stream_seed(7, "hpo_trial", i) for i in range(50)]
    assert len(set(seeds)) == 50 and all(0 <= s < 2**63 for s in seeds)
    assert seeds != spawn_seeds(8, 50)[0] and 7 not in seeds
    draws = {stream_seed(7, "hpo_draws", i) for i in range(2)}
    assert not draws & set(seeds)  # the draws are streams of their own
    assert selection.random() == np.random.default_rng(stream_seed(7, "hpo_selection")).random()


@pytest.mark.parametrize("mode", ["unaccounted", "accounted"])
def test_random_choice_has_the_grid_schema_and_composes_every_trial(mode):
    extra = {"selection_epsilon": 1.0} if mode == "accounted" else {}
    run, calls = _fake_run(fail_at=1)
    random = search_cell(CELL, TuneSettings(mode=mode, master_seed=5, **RANDOM, **extra), run)
    grid = search_cell(CELL, TuneSettings(lrs=[0.1, 1.0], mode=mode, **extra), _fake_run()[0])
    assert set(random) == set(grid)
    assert all(set(t) == set(grid["trials"][0]) for t in random["trials"] if "failed" not in t)
    assert random["strategy"] == "random" and grid["strategy"] == "grid"
    # the planned draws ran, each with its own spawned seed, and the best one was chosen
    planned = sample_trials(4, 5, RANDOM["lr_range"], RANDOM["batch_sizes"])
    assert [t["overrides"] for t in random["trials"]] == planned
    assert [t["seed"] for t in random["trials"]] == spawn_seeds(5, 4)[0]
    assert all(f"seed={t['seed']}" in c for t, c in zip(random["trials"], calls))
    assert random["overrides"] in planned and set(random["overrides"]) == {LR, BATCH_SIZE}
    if mode == "unaccounted":
        done = [t for t in random["trials"] if "failed" not in t]
        assert random["overrides"] == max(done, key=lambda t: t["score"])["overrides"]
    # every trial's ledger composes, the failed one's included
    ledgers = [t["ledger"] for t in random["trials"]]
    assert random["trials"][1]["failed"] and ledgers[1]
    composed = compose_ledgers(ledgers, 1e-5, "rdp")
    assert random["trials_epsilon"] == pytest.approx(composed)
    assert composed > compose_ledgers([ledgers[0], *ledgers[2:]], 1e-5, "rdp")
    if mode == "accounted":
        assert random["search_epsilon"] == max(composed, 1.0)


def test_two_trials_draw_independent_noise_and_batches(monkeypatch):
    """Equal lr and B: each trial's own seed gives it uncorrelated noise and other batches
    (with one shared seed, the two releases' noise was identical and cancelled)."""
    torch.set_num_threads(1)
    noise: list[torch.Tensor] = []
    batches: list[int] = []
    normal, step = torch.normal, Trainer.train_step

    def record_normal(*args, **kwargs):
        out = normal(*args, **kwargs)
        if out.numel() > 1:  # the gradient noise (extra queries are scalars)
            noise.append(out.detach().flatten() / float(args[1]))
        return out

    def record_step(self, batch):
        metrics = step(self, batch)
        batches.append(int(metrics["unprivatised"]["batch_size"]))
        return metrics

    monkeypatch.setattr(torch, "normal", record_normal)
    monkeypatch.setattr(Trainer, "train_step", record_step)
    cell = [*CELL[:3], "privacy=sigma", "privacy.noise_multiplier=1.0", *CELL[4:],
            "trainer.batch_size=100"]
    choice = search_cell(cell, TuneSettings(lrs=[0.5, 0.5]), train)
    assert len({t["seed"] for t in choice["trials"]}) == 2
    steps = len(batches) // 2
    per_trial = len(noise) // 2
    assert steps >= 10 and len(noise) == 2 * per_trial
    a, b = torch.cat(noise[:per_trial]), torch.cat(noise[per_trial:])
    assert abs(float(torch.corrcoef(torch.stack([a, b]))[0, 1])) < 0.05
    assert batches[:steps] != batches[steps:]


def test_the_random_strategy_end_to_end(tmp_path):
    """The chosen batch size reaches the final runs through choices.json."""
    torch.set_num_threads(1)
    out = tmp_path / "tune"
    assert main(["--strategy", "random", "--trials", "2", "--lr-range", "0.05,1",
                 "--batch-sizes", "50,200", "--mode", "unaccounted", "--seeds", "0",
                 "--master-seed", "3", "--out", str(out), "--", *CELL]) == 0
    (choice,) = json.loads((out / "choices.json").read_text())["cells"].values()
    assert choice["strategy"] == "random" and len(choice["trials"]) == 2
    assert choice["trials_epsilon"] > max(t["epsilon"] for t in choice["trials"])
    (record,) = [json.loads(p.read_text()) for p in (out / "runs").rglob("results.json")]
    assert record["config"]["trainer"]["batch_size"] == choice["overrides"][BATCH_SIZE]
    assert record["config"]["method"]["optimizer"]["lr"] == choice["overrides"][LR]
    assert record["tuning"]["mode"] == "unaccounted"


def _main(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize("options, match", [
    (["--trials", "3"], "--trials: only with --strategy random"),
    (["--strategy", "random", "--lrs", "0.1"], "--lrs is the grid's"),
    (["--strategy", "random", "--trials", "0"], "--trials must be an integer in [1, 1000]"),
    (["--strategy", "random", "--lr-range", "1,0.1"], "--lr-range must be two finite"),
    (["--strategy", "random", "--batch-sizes", "0"], "--batch-sizes must be integers >= 1"),
    (["--strategy", "random", "--clip-floors", "0,0.1"],
     "--clip-floors: method dpsgd has no method.settings.clip_floor"),
])
def test_random_options_are_refused_before_any_work(tmp_path, capfd, options, match):
    out = tmp_path / "deep" / "out"
    code = _main([*options, "--seeds", "0", "--out", str(out), "--", *CELL])
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and match in err[0], err
    assert not (tmp_path / "deep").exists()


@pytest.mark.parametrize("options", [
    {"lrs": [0.001, 0.01], "mode": "unaccounted", "seeds": [0, 1], "jobs": 2},
    {"strategy": "random", "trials": 5, "lr_range": [0.1, 3.0], "batch_sizes": [64, 128],
     "mode": "accounted", "selection_epsilon": 0.5, "seeds": [3], "master_seed": 9},
])
def test_the_printed_command_is_the_call(tmp_path, options):
    """What dpbench-reproduce prints for a tuned sweep runs the job it calls tune() with."""
    import shlex

    from dpbench.tune.cli import command_line, job_of, make_job, parse_args

    options = {**options, "out": tmp_path / "out"}
    argv = shlex.split(command_line(CELL, **options))
    assert argv[0] == "dpbench-tune"
    assert job_of(parse_args(argv[1:])) == make_job(CELL, **options)
