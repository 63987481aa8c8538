"""Time-series privacy unit: overlapping windows protect a window, disjoint ones an observation."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pytest

from dpbench.data import get_dataset_builder
from dpbench.errors import ConfigError
from dpbench.experiment import build_trainer
from tests.helpers.config import compose_config

WINDOW = 8


@pytest.fixture
def index_csv(tmp_path):
    """A series whose value at row r is r: a window's values name the rows it holds."""
    n = 300
    frame = pd.DataFrame({"date": pd.date_range("2021-01-01", periods=n, freq="h"),
                          "row": np.arange(n, dtype=float)})
    path = tmp_path / "rows.csv"
    frame.to_csv(path, index=False)
    return path


def _rows_per_window(path, **settings):
    data = get_dataset_builder("csv_timeseries")(path=str(path), window=WINDOW,
                                                 scaling="none", **settings)
    rows = data.train.tensors[0][:, :, 0].round().long()
    return data, Counter(rows.flatten().tolist())


@pytest.mark.parametrize("cap", [None, 7])
def test_observation_unit_puts_each_observation_in_at_most_one_training_window(index_csv, cap):
    data, counts = _rows_per_window(index_csv, privacy_unit="observation",
                                    max_train_windows=cap)
    assert max(counts.values()) == 1  # no observation is in two training windows
    assert len(data.train) == (cap or 180 // WINDOW)  # 60% of 300 rows, stride = window
    assert data.extras["privacy_unit"] == "observation"


def test_default_windows_overlap_and_the_unit_is_the_window(index_csv):
    data, counts = _rows_per_window(index_csv)
    assert max(counts.values()) == WINDOW  # an observation sits in `window` windows
    assert data.extras["privacy_unit"] == "window"
    _, counts = _rows_per_window(index_csv, train_stride=WINDOW)  # the same, by hand
    assert max(counts.values()) == 1


def test_observation_unit_refuses_overlapping_windows(index_csv):
    with pytest.raises(ConfigError, match="dataset.privacy_unit=observation needs "
                                          "non-overlapping training windows"):
        _rows_per_window(index_csv, privacy_unit="observation", train_stride=2)
    with pytest.raises(ConfigError, match="dataset.privacy_unit must be one of"):
        _rows_per_window(index_csv, privacy_unit="time_step")


TINY_TS = ("dataset=csv_timeseries", f"dataset.window={WINDOW}", "model=dit",
           "model.hidden=8", "model.depth=1", "method=dp_adaln", "trainer.batch_size=8",
           "trainer.epochs=1", "trainer.checkpoint=false", "+task.diffusion_steps=4",
           "+task.num_samples=2")


@pytest.mark.parametrize(("overrides", "unit"), [
    ((), "example"),
    (TINY_TS, "window"),
    ((*TINY_TS, "dataset.privacy_unit=observation"), "observation"),
])
def test_every_run_records_its_privacy_unit(index_csv, overrides, unit):
    extra = (f"dataset.path={index_csv}",) if overrides else ("model.hidden=16",
                                                              "trainer.epochs=1")
    result = build_trainer(compose_config(*overrides, *extra), None).fit()
    assert result["privacy_unit"] == unit
