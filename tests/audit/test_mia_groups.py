"""``dpbench-mia ... trainer.seeds_at_once=K``: the target and reference models trained K at
a time are the models trained one by one (audit/mia/model_groups.py).

Each model keeps its own seed, half of the pool, Poisson batches, noise, ledger and
accountant: its parameters equal those of the model trained alone to a float32 tolerance
(the group computes per-example gradients in closed form, a model alone by its checked
engine: they differ in rounding only), its epsilon and steps are identical, and so are the
attacks' metrics.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dpbench.audit.mia.cli import hydra_main, mia_settings, run_mia
from dpbench.audit.mia.model_groups import trained_models
from dpbench.audit.mia.models import model_builder, pool_and_population
from dpbench.audit.mia.split import memberships
from dpbench.experiment import load_data
from dpbench.spec import build_spec
from tests.audit.test_mia import mia_config
from tests.helpers.cli import run_cli
from tests.test_console_scripts import _environment

pytestmark = pytest.mark.integration

#: parameters of grouped and lone models agree to this many float32 epsilons (relative to
#: the parameters' scale), as for a sweep's seeds (tests/training/test_seed_group.py)
TOLERANCE = 512 * torch.finfo(torch.float32).eps
#: a cell whose models' halves differ in steps per epoch (a model sits out a group's steps)
CELL = ("method=dpsgd", "privacy=eps1", "mia.pool_size=100", "mia.population_size=30",
        "mia.references=3", "mia.bootstrap=20", "trainer.epochs=2", "trainer.batch_size=16")


def _close(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    scale = max(1.0, *(float(x.abs().max()) for x in a))
    return all(torch.allclose(x, y, rtol=TOLERANCE, atol=TOLERANCE * scale)
               for x, y in zip(a, b))


@pytest.mark.parametrize("model", ["logreg", "mlp"])
def test_grouped_models_equal_the_models_trained_one_by_one(model):
    def models(at_once: int):
        spec = build_spec(mia_config(*CELL, f"model={model}",
                                     f"trainer.seeds_at_once={at_once}"))
        settings = mia_settings(spec.cfg)
        pool, _ = pool_and_population(load_data(spec.cfg), settings)
        masks = memberships(settings.seed, settings.models, len(pool))
        return list(trained_models(spec, settings.models,
                                   model_builder(spec, settings, pool, masks)))

    alone, grouped = models(1), models(3)  # 4 models: a group of 3, then one of 1
    assert len(alone) == len(grouped) == 4
    assert len({t.plan.steps_per_epoch for t, _ in grouped}) > 1  # some model sat out steps
    for (a, sa), (g, sg) in zip(alone, grouped):
        assert a.grad_sample_mode != "seed_group" and g.grad_sample_mode == "seed_group"
        assert [c["when"] for c in g.engine_checks] == ["start", "grouped"]
        assert a.seed == g.seed and a.step == g.step == sa["steps"] == sg["steps"]
        assert a.ledger.to_json() == g.ledger.to_json()
        assert sa["epsilon"] == sg["epsilon"]
        assert _close([p.detach() for p in a.params], [p.detach() for p in g.params]), (
            f"model seed {a.seed}: grouped parameters differ from the model trained alone")
    # every model its own: no two models end with the same parameters
    finals = [torch.cat([p.detach().flatten() for p in g.params]) for g, _ in grouped]
    assert all(not torch.equal(x, y) for i, x in enumerate(finals) for y in finals[i + 1:])


def test_grouped_mia_scores_and_metrics_are_the_lone_models(tmp_path):
    records, scores = {}, {}
    for at_once in (1, 4):
        run_dir = tmp_path / str(at_once)
        run_dir.mkdir()
        records[at_once] = run_mia(mia_config(*CELL, f"trainer.seeds_at_once={at_once}"),
                                   run_dir)
        scores[at_once] = dict(np.load(run_dir / "scores.npz"))
    alone, grouped = records[1], records[4]
    # every metric identical; a threshold is a score, equal to the models' tolerance
    _assert_same_metrics(alone["mia"]["attacks"], grouped["mia"]["attacks"], "attacks")
    assert alone["mia"]["model_epsilons"] == grouped["mia"]["model_epsilons"]
    assert alone["metrics"]["accuracy"] == grouped["metrics"]["accuracy"]
    assert alone["metrics"]["loss"] == pytest.approx(grouped["metrics"]["loss"],
                                                     rel=64 * TOLERANCE)
    assert (alone["grad_sample_mode"], grouped["grad_sample_mode"]) == ("bk", "seed_group")
    assert scores[1].keys() == scores[4].keys()
    for key, value in scores[1].items():
        if value.dtype == bool or value.ndim == 0:
            assert np.array_equal(value, scores[4][key]), key
        else:  # float64 read-outs of float32 models: the models' tolerance, scaled
            scale = max(1.0, float(np.abs(value).max()))
            assert np.allclose(value, scores[4][key], rtol=64 * TOLERANCE,
                               atol=64 * TOLERANCE * scale), key


def _assert_same_metrics(a, b, where: str) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_same_metrics(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_metrics(x, y, f"{where}[{i}]")
    elif where.endswith(".threshold") and a is not None:
        assert a == pytest.approx(b, rel=64 * TOLERANCE, abs=64 * TOLERANCE), where
    else:
        assert a == b, where


def test_what_cannot_be_grouped_is_refused_before_any_model_trains(tmp_path, monkeypatch,
                                                                   capfd):
    run_dir = tmp_path / "mia"
    code = run_cli(hydra_main, [*CELL, "method=dpadam", "trainer.seeds_at_once=2",
                                f"hydra.run.dir={run_dir}"], monkeypatch)
    err = capfd.readouterr().err
    assert code == 2
    line = next(x for x in err.splitlines() if "seeds_at_once" in x)
    assert "method=dpadam" in line and "trained" not in err
    assert not (run_dir / "results.json").exists()


@pytest.mark.processes
def test_dpbench_mia_trains_its_models_grouped_from_a_fresh_process(tmp_path):
    run_dir = tmp_path / "mia"
    command = [str(Path(sys.executable).parent / "dpbench-mia"), *CELL,
               "trainer.seeds_at_once=4", f"hydra.run.dir={run_dir}"]
    done = subprocess.run(command, cwd=tmp_path, env=dict(_environment(tmp_path)),
                          capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((run_dir / "results.json").read_text())
    assert record["kind"] == "mia" and record["status"] == "completed"
    assert record["grad_sample_mode"] == "seed_group"
    assert record["config"]["trainer"]["seeds_at_once"] == 4
    assert len(record["mia"]["model_epsilons"]) == 4
    assert "model 4/4 (reference) trained" in done.stderr
    assert "| dpsgd | digits |" in done.stdout


def test_a_models_batches_through_the_pools_subsets_are_its_loaders_batches():
    """The group fetches a model's batches by indexing the data set's tensors through the
    pool's and the half's ``Subset``s: the very tensors its own loader yields."""
    from dpbench.training.batches import tensor_rows
    from dpbench.training.seed_group import epoch_batches

    def model():
        spec = build_spec(mia_config(*CELL, "trainer.batch_size=4"))
        settings = mia_settings(spec.cfg)
        pool, _ = pool_and_population(load_data(spec.cfg), settings)
        masks = memberships(settings.seed, settings.models, len(pool))
        return model_builder(spec, settings, pool, masks)(1)

    ours, theirs = model(), model()
    assert tensor_rows(ours.train_loader.dataset) is not None  # the indexing path is taken
    for _ in range(2):
        mine, loaders = list(epoch_batches(ours)), list(theirs.epoch_batches())
        assert len(mine) == len(loaders) == ours.plan.steps_per_epoch
        for a, b in zip(mine, loaders):
            assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(ours.sampler_generator.get_state(), theirs.sampler_generator.get_state())


def test_reference_models_compute_their_epsilon_at_the_last_epoch_only():
    """A reference model's per-epoch epsilons reach no record (only the target's summary
    does): it computes the epsilon of its last epoch only; everything else it does and
    reports equals the same model computing every epoch's (post-processing skipped, nothing
    else)."""
    from torch.utils.data import Subset

    from dpbench.audit.mia.models import _OnHalf
    from dpbench.audit.mia.split import model_seed
    from dpbench.experiment import build

    def untimed(value):  # a summary without its clocks (wall time, the engine check's seconds)
        if isinstance(value, dict):
            return {k: untimed(v) for k, v in value.items()
                    if k not in ("wall_time_s", "seconds", "time")}
        return [untimed(v) for v in value] if isinstance(value, list) else value

    spec = build_spec(mia_config(*CELL, "trainer.epochs=3"))
    settings = mia_settings(spec.cfg)
    pool, _ = pool_and_population(load_data(spec.cfg), settings)
    masks = memberships(settings.seed, settings.models, len(pool))
    trained = list(trained_models(spec, settings.models,
                                  model_builder(spec, settings, pool, masks)))
    target, _ = trained[0]
    assert all(row["epsilon"] is not None for row in target.history)  # the record's history
    for k, (reference, summary) in enumerate(trained[1:], start=1):
        assert [row["epsilon"] is None for row in reference.history] == [True, True, False]
        every = build(spec.with_seed(model_seed(settings.seed, k)), None, make_trainer=_OnHalf(
            Subset(pool, np.flatnonzero(masks[k]).tolist()), epoch_epsilon=True))
        full = every.fit()
        assert all(row["epsilon"] is not None for row in every.history)
        assert summary["epsilon"] == full["epsilon"] == reference.history[-1]["epsilon"]
        same = lambda x, y: json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True)  # noqa: E731 - NaN bins
        assert same([{**r, "epsilon": None} for r in reference.history],
                    [{**r, "epsilon": None} for r in every.history])
        assert reference.ledger.to_json() == every.ledger.to_json()
        assert all(torch.equal(a, b) for a, b in zip(reference.params, every.params))
        assert same(untimed({**summary, "history": None}), untimed({**full, "history": None}))
