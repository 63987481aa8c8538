"""ts_diffusion task: per-example loss, shared draws, sampling, metrics and diagnostics."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from dpbench.data import get_dataset_builder
from dpbench.models.dit import time_series_dit
from dpbench.tasks.ts_diffusion import TimeSeriesDiffusion
from tests.helpers.config import compose_config, run_config

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

TINY = ["model=dit", "model.hidden=8", "model.depth=1", "trainer.batch_size=16",
        "trainer.checkpoint=false", "dataset.window=8", "dataset.test_stride=8",
        "+task.diffusion_steps=8", "+task.num_samples=3"]


@pytest.fixture
def sine_csv(tmp_path):
    n = 400
    t = np.arange(n)
    frame = pd.DataFrame({"date": pd.date_range("2021-01-01", periods=n, freq="h"),
                          "a": np.sin(2 * np.pi * t / 24), "b": np.cos(2 * np.pi * t / 24)})
    path = tmp_path / "sine.csv"
    frame.to_csv(path, index=False)
    return path


def test_draws_are_shared_within_a_batch_and_fresh_across_batches(sine_csv):
    data = get_dataset_builder("csv_timeseries")(path=str(sine_csv), window=8)
    task = TimeSeriesDiffusion(data, diffusion_steps=10)
    batch = tuple(t[:4] for t in data.train.tensors)
    model = time_series_dit((8, 2), data=data, hidden=8, depth=1)
    torch.manual_seed(0)
    first = task.per_example_loss(model, batch)
    assert torch.equal(first, task.per_example_loss(model, batch))  # 2nd point, same draws
    other = tuple(t.clone() for t in batch)
    assert not torch.equal(first, task.per_example_loss(model, other))
    assert first.shape == (4,)


def test_sample_shapes_and_zero_outside_targets(sine_csv):
    data = get_dataset_builder("csv_timeseries")(path=str(sine_csv), window=8)
    task = TimeSeriesDiffusion(data, diffusion_steps=5)
    model = time_series_dit((8, 2), data=data, hidden=8, depth=1)
    batch = tuple(t[:3] for t in data.test.tensors)
    s = task.sample(model, batch, 4, torch.Generator().manual_seed(0))
    assert s.shape == (4, 3, 8, 2)
    assert float(s[:, batch[2] == 0].abs().max()) == 0.0


def test_private_run_reports_metrics_and_gradient_diagnostics(sine_csv):
    cfg = compose_config("dataset=csv_timeseries", f"dataset.path={sine_csv}",
                         "method=dp_adaln", "privacy=sigma", "privacy.noise_multiplier=1.0",
                         "trainer.epochs=1", *TINY)
    out = run_config(cfg)
    m, diag = out["metrics"], out["unprivatised_diagnostics"]["final"]
    assert math.isfinite(out["epsilon"])
    for key in ("rmse", "mae", "mape", "crps", "js", "acf_distance"):
        assert key in m
    for key in ("g_cond_p99", "g_rest_max", "clip_rate", "clip_severity"):
        assert key in diag and key not in m  # training diagnostics stay out of the metrics
    assert "NOT PRIVATISED" in out["unprivatised_diagnostics"]["note"]
    assert 0 < len(diag["g_cond_norms"]) <= 2000
    assert all(c <= t + 1e-6 for c, t in zip(diag["g_cond_norms"], diag["g_total_norms"]))


@pytest.mark.parametrize("method", ["dpsgd", "dp_vanilla"])
def test_model_option_composes_with_any_method(sine_csv, method):
    from dpbench.experiment import build_trainer

    cfg = compose_config("dataset=csv_timeseries", f"dataset.path={sine_csv}",
                         f"method={method}", "model.dp_aware=true", "trainer.epochs=1",
                         "privacy=sigma", *TINY)
    trainer = build_trainer(cfg, None)
    assert trainer.model.bounds.enabled is (method == "dpsgd")  # dp_vanilla switches it off


def test_nonprivate_training_beats_the_untrained_model(sine_csv):
    base = ["dataset=csv_timeseries", f"dataset.path={sine_csv}", "method=dp_adaln",
            "privacy=nonprivate", "method.optimizer.lr=0.01", *TINY]
    trained = run_config(compose_config(*base, "trainer.epochs=8"))["metrics"]
    cfg = compose_config(*base, "trainer.epochs=1", "method.optimizer.lr=1e-12")
    untrained = run_config(cfg)["metrics"]
    assert trained["rmse"] < 0.7 * untrained["rmse"]
    assert trained["crps"] < untrained["crps"]


def test_gradient_diagnostics_survive_a_resume(sine_csv, tmp_path):
    """The g_cond summary of a run killed mid-way and resumed equals the uninterrupted one's."""
    from dpbench.experiment import build_trainer
    from dpbench.training.loop import Callback

    class Kill(Callback):
        def on_step_end(self, trainer, metrics):
            if trainer.epoch == 1 and trainer.step == trainer.plan.steps_per_epoch + 1:
                raise KeyboardInterrupt

    base = ["dataset=csv_timeseries", f"dataset.path={sine_csv}", "method=dp_adaln",
            "privacy=sigma", "privacy.noise_multiplier=1.0", "trainer.epochs=2",
            "trainer.eval_every=2", *[o for o in TINY if o != "trainer.checkpoint=false"]]
    full = build_trainer(compose_config(*base), tmp_path / "full").fit()
    full = full["unprivatised_diagnostics"]["final"]
    killed = build_trainer(compose_config(*base), tmp_path / "killed", [Kill()])
    with pytest.raises(KeyboardInterrupt):
        killed.fit()
    resumed = build_trainer(compose_config(*base, "trainer.resume=true"), tmp_path / "killed")
    resumed.maybe_resume()
    out = resumed.fit()["unprivatised_diagnostics"]["final"]
    assert len(out["g_cond_norms"]) == len(full["g_cond_norms"])
    assert out["g_cond_p99"] == pytest.approx(full["g_cond_p99"])
