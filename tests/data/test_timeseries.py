"""Time-series windows: splits, masks, public scaling, the CSV loader, no target leakage."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from dpbench.data import get_dataset_builder
from dpbench.data.timeseries import WindowSpec, draw_target_mask
from dpbench.errors import ConfigError
from dpbench.tasks.ts_diffusion import TimeSeriesDiffusion
from tests.helpers.synthetic import write_ett


def test_etth1_split_windows_and_public_scaling(tmp_path):
    frame = write_ett(tmp_path, "etth1")
    data = get_dataset_builder("etth1")(root=tmp_path, window=24, train_stride=24,
                                        test_stride=24)
    raw = frame.drop(columns="date").to_numpy(np.float32)
    val = raw[8640:11520]
    np.testing.assert_allclose(data.extras["loc"], val.mean(axis=0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(data.extras["scale"], val.std(axis=0), rtol=1e-4, atol=1e-4)
    assert len(data.train) == 8640 // 24 and data.input_shape == (24, 7)
    assert len(data.test) == (14400 - (11520 - 24)) // 24
    loc, scale = np.array(data.extras["loc"]), np.array(data.extras["scale"])
    first_test = data.test[0][0].numpy() * scale + loc  # starts 24 rows before the test months
    np.testing.assert_allclose(first_test, raw[11520 - 24:11520], rtol=1e-4, atol=1e-3)
    target, observed = data.test.tensors[2], data.test.tensors[1]
    assert bool((target <= observed).all()) and 0.25 < float(target.mean()) < 0.35


def test_forecast_and_block_masks():
    obs = torch.ones(5, 12, 3)
    fc = draw_target_mask(obs, WindowSpec(window=12, mode="forecast", horizon=4))
    assert torch.equal(fc[:, 8:], torch.ones(5, 4, 3)) and fc[:, :8].sum() == 0
    blk = draw_target_mask(obs, WindowSpec(window=12, missing="block", missing_ratio=0.25),
                           torch.Generator().manual_seed(0))
    assert torch.equal(blk.sum(dim=1), torch.full((5, 3), 3.0))
    runs = (blk[:, 1:] - blk[:, :-1]).abs().sum(dim=1) + blk[:, 0] + blk[:, -1]
    assert torch.equal(runs, torch.full((5, 3), 2.0))  # one contiguous block per channel


def _csv(tmp_path, n=200):
    dates = pd.date_range("2020-01-01", periods=n, freq="h")
    t = np.arange(n)
    frame = pd.DataFrame({"date": dates, "a": np.sin(t / 5.0), "b": np.cos(t / 7.0) * 3})
    frame.loc[10, "a"] = np.nan
    path = tmp_path / "series.csv"
    frame.to_csv(path, index=False)
    return path


def test_csv_loader_nan_is_unobserved_and_never_a_target(tmp_path):
    data = get_dataset_builder("csv_timeseries")(path=str(_csv(tmp_path)), window=12,
                                                 train_stride=1, missing_ratio=0.5)
    values, observed, target, feats = data.train.tensors
    assert feats.shape[-1] == 5 and data.extras["channels"] == ["a", "b"]
    hit = observed[10, 0, 0]  # window 10 starts at the NaN row
    assert float(hit) == 0.0 and float(target[10, 0, 0]) == 0.0 and float(values[10, 0, 0]) == 0
    with pytest.raises(ConfigError):
        get_dataset_builder("csv_timeseries")(path=str(_csv(tmp_path)), scaling="fixed")
    with pytest.raises(ConfigError):
        get_dataset_builder("csv_timeseries")(path=str(_csv(tmp_path)), mode="forecast",
                                              horizon=0)


def test_targets_never_reach_the_condition(tmp_path):
    from dpbench.models.dit import time_series_dit

    data = get_dataset_builder("csv_timeseries")(path=str(_csv(tmp_path)), window=12)
    values, observed, target, feats = data.test.tensors
    perturbed = values + 100.0 * target * torch.randn_like(values)
    assert not torch.equal(perturbed, values)
    cv, cm = TimeSeriesDiffusion.condition_inputs(values, observed, target)
    pv, pm = TimeSeriesDiffusion.condition_inputs(perturbed, observed, target)
    assert torch.equal(cv, pv) and torch.equal(cm, pm)
    model = time_series_dit((12, 2), data=data)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
        step = torch.zeros(len(values), dtype=torch.long)
        assert torch.equal(model.condition(step, cv, cm, feats),
                           model.condition(step, pv, pm, feats))


def test_ettm1_reads_the_gzip_and_uses_four_times_the_rows(tmp_path):
    frame = write_ett(tmp_path, "ettm1")
    data = get_dataset_builder("ettm1")(root=tmp_path, window=96, train_stride=96,
                                        test_stride=96, mode="forecast", horizon=24)
    assert len(data.train) == 34560 // 96 and len(data.test) == (11520 + 96) // 96
    target = data.test.tensors[2]
    assert float(target[:, -24:].mean()) == 1.0 and float(target[:, :-24].sum()) == 0.0
    val = frame.drop(columns="date").to_numpy(np.float32)[34560:46080]
    np.testing.assert_allclose(data.extras["loc"], val.mean(axis=0), rtol=1e-4, atol=1e-4)
    minutes = data.train.tensors[3][0, :4, 0]  # minute-of-hour feature: 0, 15, 30, 45
    np.testing.assert_allclose(minutes.numpy(), np.array([0, 15, 30, 45]) / 59.0 - 0.5,
                               atol=1e-6)
    with pytest.raises(ConfigError):
        get_dataset_builder("ettm1")(root=None)
