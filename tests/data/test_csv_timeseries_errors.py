"""A CSV time series with a bad cell, date or column fails with one clear DataError naming
the column and row, before any training; it never silently drops a column."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpbench.data import get_dataset_builder
from dpbench.errors import DataError

N = 200  # rows; split 0.6/0.2/0.2: train [0, 120), validation [120, 160), test [160, 200)


def _write(tmp_path, frame: pd.DataFrame):
    path = tmp_path / "series.csv"
    frame.to_csv(path, index=False)
    return path


def _frame() -> pd.DataFrame:
    t = np.arange(N)
    return pd.DataFrame({"date": pd.date_range("2020-01-01", periods=N, freq="h").astype(str),
                         "a": np.sin(t / 5.0), "b": np.cos(t / 7.0) * 3})


def _build(path, **kwargs):
    return get_dataset_builder("csv_timeseries")(path=str(path), window=12, **kwargs)


def test_clean_file_keeps_every_column(tmp_path):
    assert _build(_write(tmp_path, _frame())).extras["channels"] == ["a", "b"]


def test_empty_cells_are_unobserved_not_errors(tmp_path):
    frame = _frame().astype({"b": object})
    frame.loc[5, "b"] = ""
    frame.loc[6, "b"] = None
    data = _build(_write(tmp_path, frame))
    assert data.extras["channels"] == ["a", "b"]


@pytest.mark.parametrize("columns", [None, ["a", "b"]], ids=["all columns", "named columns"])
def test_non_numeric_cell_names_its_column_instead_of_dropping_it(tmp_path, columns):
    frame = _frame().astype({"b": object})
    frame.loc[41, "b"] = "n/a?"
    with pytest.raises(DataError, match=r"column 'b' has 1 non-numeric cell\(s\), first "
                                        r"'n/a\?' in data row 42"):
        _build(_write(tmp_path, frame), columns=columns)


def test_column_all_missing_in_the_scaling_months(tmp_path):
    frame = _frame()
    frame.loc[120:159, "b"] = np.nan  # every validation row: no public mean/std for b
    path = _write(tmp_path, frame)
    with pytest.raises(DataError, match=r"column\(s\) \['b'\] have no observed value in the "
                                        r"validation rows"):
        _build(path)
    assert _build(path, scaling="none").extras["channels"] == ["a", "b"]  # no constants needed


def test_unparsable_date_names_the_date_column(tmp_path):
    frame = _frame()
    frame.loc[7, "date"] = "not a date"
    with pytest.raises(DataError, match=r"dataset.date_column 'date' of .* has 1 cell\(s\) that "
                                        r"are not dates, first 'not a date' in data row 8"):
        _build(_write(tmp_path, frame))


def test_header_only_file(tmp_path):
    path = tmp_path / "series.csv"
    path.write_text("date,a,b\n")
    with pytest.raises(DataError, match="has a header but no rows"):
        _build(path)


def test_empty_file(tmp_path):
    path = tmp_path / "series.csv"
    path.write_text("")
    with pytest.raises(DataError, match="is empty"):
        _build(path)


def test_cli_refuses_a_bad_csv_before_training(tmp_path, monkeypatch, capfd):
    from dpbench.cli import hydra_main
    from tests.helpers.cli import run_cli

    frame = _frame().astype({"a": object})
    frame.loc[3, "a"] = "1,5"
    path = _write(tmp_path, frame)
    run_dir = tmp_path / "run"
    code = run_cli(hydra_main, ["dataset=csv_timeseries", f"dataset.path={path}",
                                  "dataset.window=12", "model=dit", "model.hidden=8",
                                  "model.depth=1", "method=dp_adaln", "trainer.epochs=1",
                                  "trainer.batch_size=16",
                                  f"hydra.run.dir={run_dir}"], monkeypatch)
    err = capfd.readouterr().err
    assert code == 2, err
    assert "column 'a' has 1 non-numeric cell(s), first '1,5' in data row 4" in err
    assert "Traceback" not in err and not run_dir.exists()
