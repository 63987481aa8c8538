"""Multivariate time series for conditional diffusion: ETT (h1, h2, m1, m2) and any CSV.

Each example is one window of ``window`` time steps and K channels, returned as the tuple
``(values, observed_mask, target_mask, time_features)`` of shapes [L, K], [L, K], [L, K],
[L, F]. Values are scaled as ``(x - loc) / scale``; the targets are the entries the model must
generate (imputation: random or block missingness; forecasting: the last ``horizon`` steps).

Scaling (no data-dependent preprocessing on private data): ``scaling: public`` (default) takes
per-channel mean and std of the *validation* months, which are neither trained on nor tested
on and are treated as public data; ``scaling: fixed`` takes ``loc``/``scale`` lists from the
config; ``scaling: none`` leaves values as they are. The training months are never read for
constants. Test masks are drawn once from a fixed seed (the same for every run); training
masks are drawn afresh every step by the ``ts_diffusion`` task.

Privacy unit: DP-SGD protects one training *window*. With the default stride 1 an observation
(one time step, all channels) lies in up to ``window`` overlapping windows, so the guarantee is
per window, not per observation. ``privacy_unit: observation`` cuts non-overlapping training
windows (stride = window), so each observation lies in exactly one window and the window
guarantee covers it. results.json records the unit that holds (``privacy_unit``).

ETT splits (Informer convention, 12/4/4 months): ETTh rows [0, 8640), [8640 - L, 11520),
[11520 - L, 14400); ETTm the same times 4.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.utils.data import TensorDataset

from dpbench.data import register_dataset
from dpbench.data.base import SPLIT_SEED, TaskData, read_failed, resolve_data_root
from dpbench.errors import ConfigError, DataError

TASK = "ts_diffusion"
ETT_FILES = {"etth1": "ETTh1.csv", "etth2": "ETTh2.csv",
             "ettm1": "ETTm1.csv.gz", "ettm2": "ETTm2.csv.gz"}
ETT_HOURLY_BORDERS = (8640, 11520, 14400)  # ends of train, val, test (rows, hourly files)
MODES = ("imputation", "forecast")
MISSING = ("random", "block")
SCALINGS = ("public", "fixed", "none")
PRIVACY_UNITS = ("window", "observation")
NUM_TIME_FEATURES = 5


@dataclass
class WindowSpec:
    """How a series is cut into examples and which entries are targets."""

    window: int = 24
    mode: str = "imputation"
    missing: str = "random"
    missing_ratio: float = 0.3
    horizon: int = 0
    train_stride: int | None = None  # None: 1, or ``window`` for privacy_unit=observation
    test_stride: int = 24
    privacy_unit: str = "window"  # what one DP "example" protects: window | observation

    def check(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"dataset.mode must be one of {MODES} (got {self.mode!r})")
        if self.missing not in MISSING:
            raise ConfigError(f"dataset.missing must be one of {MISSING} (got {self.missing!r})")
        if self.window < 2:
            raise ConfigError(f"dataset.window must be >= 2 (got {self.window})")
        if not 0 < self.missing_ratio < 1:
            raise ConfigError(f"dataset.missing_ratio must be in (0, 1) "
                              f"(got {self.missing_ratio})")
        if self.mode == "forecast" and not 0 < self.horizon < self.window:
            raise ConfigError(f"dataset.horizon must be in (0, window={self.window}) for "
                              f"forecasting (got {self.horizon})")
        if self.privacy_unit not in PRIVACY_UNITS:
            raise ConfigError(f"dataset.privacy_unit must be one of {PRIVACY_UNITS} "
                              f"(got {self.privacy_unit!r})")
        if self.train_stride is None:
            self.train_stride = self.window if self.privacy_unit == "observation" else 1
        if self.train_stride < 1 or self.test_stride < 1:
            raise ConfigError("dataset.train_stride and dataset.test_stride must be >= 1")
        if self.privacy_unit == "observation" and self.train_stride < self.window:
            raise ConfigError(
                "dataset.privacy_unit=observation needs non-overlapping training windows: "
                f"dataset.train_stride >= dataset.window = {self.window} (got "
                f"{self.train_stride}); leave train_stride null to use the window")

    def recorded_unit(self) -> str:
        """Return the privacy unit that holds: ``observation`` if no two windows overlap."""
        return "observation" if self.train_stride >= self.window else "window"

    def windows_per_observation(self) -> int:
        """Return the most training windows one observation lies in: ceil(window / stride)."""
        return -(-self.window // self.train_stride)


def time_features(dates: pd.DatetimeIndex) -> np.ndarray:
    """Return [T, 5] calendar covariates in [-0.5, 0.5] (Informer's ``timeF`` encoding).

    Minute of hour, hour of day, day of week, day of month, day of year: public facts of the
    timestamp, not of the measured values.
    """
    feats = [dates.minute / 59.0, dates.hour / 23.0, dates.day_of_week / 6.0,
             (dates.day - 1) / 30.0, (dates.day_of_year - 1) / 365.0]
    return (np.stack([np.asarray(f, dtype=np.float32) for f in feats], axis=1) - 0.5)


def draw_target_mask(observed: torch.Tensor, spec: WindowSpec,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Return a {0,1} mask [n, L, K] of entries to generate; a subset of ``observed``.

    random: each observed entry independently with probability ``missing_ratio`` (CSDI's
    random strategy); block: per channel one contiguous run of round(ratio * L) steps at a
    random start; forecast: every channel over the last ``horizon`` steps.
    """
    n, L, K = observed.shape
    if spec.mode == "forecast":
        mask = torch.zeros_like(observed)
        mask[:, L - spec.horizon:, :] = 1.0
        return mask * observed
    if spec.missing == "random":
        u = torch.rand(observed.shape, generator=generator, device=observed.device)
        mask = (u < spec.missing_ratio).to(observed.dtype)
    else:
        length = max(1, int(round(spec.missing_ratio * L)))
        start = torch.randint(0, L - length + 1, (n, 1, K), generator=generator,
                              device=observed.device)
        steps = torch.arange(L, device=observed.device).view(1, L, 1)
        mask = ((steps >= start) & (steps < start + length)).to(observed.dtype)
    return mask * observed


def windows(values: np.ndarray, observed: np.ndarray, feats: np.ndarray, window: int,
            stride: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return stacked windows [n, L, .] of the values, observed mask and time features."""
    starts = range(0, values.shape[0] - window + 1, stride)
    if len(starts) == 0:
        raise DataError(f"a split of {values.shape[0]} rows is shorter than window={window}")
    take = lambda a: torch.tensor(np.stack([a[s:s + window] for s in starts]))  # noqa: E731
    return take(values), take(observed), take(feats)


def _scale_constants(scaling: str, public: np.ndarray, k: int, loc, scale
                     ) -> tuple[np.ndarray, np.ndarray]:
    if scaling == "public":
        mu = np.nanmean(public, axis=0)
        sd = np.nanstd(public, axis=0)
        return mu.astype(np.float32), np.where(sd > 0, sd, 1.0).astype(np.float32)
    if scaling == "fixed":
        if loc is None or scale is None or len(loc) != k or len(scale) != k:
            raise ConfigError(f"dataset.scaling=fixed needs dataset.loc and dataset.scale "
                              f"lists of {k} numbers (one per channel)")
        if any(s <= 0 for s in scale):
            raise ConfigError("dataset.scale entries must be > 0")
        return np.asarray(loc, np.float32), np.asarray(scale, np.float32)
    if scaling == "none":
        return np.zeros(k, np.float32), np.ones(k, np.float32)
    raise ConfigError(f"dataset.scaling must be one of {SCALINGS} (got {scaling!r})")


def build_series_task(name: str, frame: pd.DataFrame, columns: list[str], date_column: str,
                      borders: tuple[int, int, int], spec: WindowSpec, scaling: str,
                      loc=None, scale=None, max_train_windows: int | None = None,
                      max_test_windows: int | None = None) -> TaskData:
    """Return the windowed train/test sets of ``frame`` split at row ``borders``."""
    spec.check()
    raw = frame[columns].to_numpy(dtype=np.float32)
    observed = (~np.isnan(raw)).astype(np.float32)
    feats = time_features(pd.DatetimeIndex(pd.to_datetime(frame[date_column])))
    train_end, val_end, test_end = borders
    L = spec.window
    if train_end < L or val_end - train_end < 1 or test_end - val_end < 1:
        raise DataError(f"{name}: split borders {borders} leave an empty split for window {L}")
    mu, sd = _scale_constants(scaling, raw[train_end:val_end], len(columns), loc, scale)
    values = np.nan_to_num((raw - mu) / sd)
    parts = {}
    for split, (lo, hi, stride, cap) in {
            "train": (0, train_end, spec.train_stride, max_train_windows),
            "test": (val_end - L, test_end, spec.test_stride, max_test_windows)}.items():
        v, o, f = windows(values[lo:hi], observed[lo:hi], feats[lo:hi], L, stride)
        if cap is not None and cap < v.shape[0]:  # evenly spaced, data-independent subset
            keep = torch.linspace(0, v.shape[0] - 1, cap).round().long()
            v, o, f = v[keep], o[keep], f[keep]
        parts[split] = (v, o, f)
    gen = torch.Generator().manual_seed(SPLIT_SEED)
    test_v, test_o, test_f = parts["test"]
    test_target = draw_target_mask(test_o, spec, gen)
    train_v, train_o, train_f = parts["train"]
    train_target = draw_target_mask(train_o, spec, gen)  # replaced every step by the task
    notes = [f"{name}: values scaled with {scaling} constants"
             + (" (mean/std of the validation months, treated as public)"
                if scaling == "public" else ""),
             f"{name}: privacy unit {spec.recorded_unit()}: one observation lies in at most "
             f"{spec.windows_per_observation()} training window(s) (stride "
             f"{spec.train_stride}, window {L})"]
    return TaskData(
        name=name, task=TASK,
        train=TensorDataset(train_v, train_o, train_target, train_f),
        test=TensorDataset(test_v, test_o, test_target, test_f),
        input_shape=(L, len(columns)), notes=notes,
        extras={"channels": list(columns), "loc": mu.tolist(), "scale": sd.tolist(),
                "num_time_features": NUM_TIME_FEATURES, "window_spec": spec,
                "privacy_unit": spec.recorded_unit()},
    )


def _read_csv(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise DataError(f"{path} not found; set paths.data_root (or DPBENCH_DATA_ROOT) to the "
                        "folder that holds ETT-small/")
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError as err:
        raise DataError(f"{path} is empty (not even a header row)") from err
    except Exception as err:  # noqa: BLE001 - pandas raises many kinds on a bad file
        raise read_failed(path, err) from err


def _ett_builder(key: str):
    def build(root=None, window: int = 24, mode: str = "imputation", missing: str = "random",
              missing_ratio: float = 0.3, horizon: int = 0, train_stride: int | None = None,
              test_stride: int = 24, scaling: str = "public", loc=None, scale=None,
              max_train_windows: int | None = None, max_test_windows: int | None = None,
              privacy_unit: str = "window") -> TaskData:
        """Return an ETT task with the standard 12/4/4-month split."""
        data_root = resolve_data_root(root)
        if data_root is None:
            raise ConfigError("ETT needs paths.data_root (or DPBENCH_DATA_ROOT): the folder "
                              "holding ETT-small/")
        frame = _read_csv(data_root / "ETT-small" / ETT_FILES[key])
        factor = 4 if key.startswith("ettm") else 1
        borders = tuple(b * factor for b in ETT_HOURLY_BORDERS)
        spec = WindowSpec(window, mode, missing, missing_ratio, horizon, train_stride,
                          test_stride, privacy_unit)
        columns = [c for c in frame.columns if c != "date"]
        return build_series_task(key, frame, columns, "date", borders, spec, scaling, loc,
                                 scale, max_train_windows, max_test_windows)

    build.__name__ = f"build_{key}"
    return build


for _key in ETT_FILES:
    register_dataset(_key)(_ett_builder(_key))


def _numeric_columns(frame: pd.DataFrame, columns: list[str], path: str) -> pd.DataFrame:
    """Return ``frame`` with ``columns`` as floats; an empty cell is NaN (unobserved).

    A cell that is present but not a finite number (``inf`` included) is an error naming its
    column and row, never a reason to drop the column.
    """
    frame = frame.copy()
    for col in columns:
        values = pd.to_numeric(frame[col], errors="coerce")
        text = frame[col].astype("string").str.strip()
        bad = values.isna() & frame[col].notna() & (text != "")
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            raise DataError(
                f"dataset.path {path}: column {col!r} has {int(bad.sum())} non-numeric "
                f"cell(s), first {frame[col].iloc[row]!r} in data row {row + 1}; fix the file, "
                f"leave missing values empty, or leave the column out with dataset.columns")
        as_float = values.astype(np.float32)  # a finite cell beyond float32's range overflows
        infinite = np.isinf(as_float.to_numpy())
        if infinite.any():
            row = int(infinite.nonzero()[0][0])
            raise DataError(
                f"dataset.path {path}: column {col!r} has {int(infinite.sum())} infinite "
                f"cell(s) (or beyond float32's range), first {frame[col].iloc[row]!r} in data "
                f"row {row + 1}; leave missing values empty instead")
        frame[col] = as_float
    return frame


def _check_dates(dates: pd.Series, date_column: str, path: str) -> None:
    """Raise DataError naming the first cell of ``date_column`` that is not a date."""
    parsed = pd.to_datetime(dates, errors="coerce")  # as build_series_task parses them
    bad = parsed.isna()
    if bad.any():
        row = int(bad.to_numpy().nonzero()[0][0])
        raise DataError(f"dataset.date_column {date_column!r} of {path} has {int(bad.sum())} "
                        f"cell(s) that are not dates, first {dates.iloc[row]!r} in data row "
                        f"{row + 1}")


def _check_observed(scaling_rows: pd.DataFrame, path: str) -> None:
    """Raise DataError for a column with no value in the rows that set the public scaling."""
    empty = [c for c in scaling_rows.columns if scaling_rows[c].isna().all()]
    if empty:
        raise DataError(
            f"dataset.path {path}: column(s) {empty} have no observed value in the validation "
            f"rows that set dataset.scaling=public; leave them out with dataset.columns or use "
            f"dataset.scaling=fixed with dataset.loc/dataset.scale")


@register_dataset("csv_timeseries")
def build_csv_timeseries(path: str | None = None, date_column: str = "date",
                         columns: list[str] | None = None,
                         split_fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
                         window: int = 24, mode: str = "imputation", missing: str = "random",
                         missing_ratio: float = 0.3, horizon: int = 0,
                         train_stride: int | None = None, test_stride: int = 24,
                         scaling: str = "public", loc=None, scale=None,
                         max_train_windows: int | None = None,
                         max_test_windows: int | None = None,
                         privacy_unit: str = "window") -> TaskData:
    """Return a task from any CSV with a date column; chronological train/val/test split.

    NaN cells are unobserved (never targets, zero in the condition).
    """
    if not path:
        raise ConfigError("dataset.path must name a CSV file")
    frame = _read_csv(Path(path).expanduser())
    if date_column not in frame.columns:
        raise ConfigError(f"dataset.date_column {date_column!r} is not a column of {path}")
    if frame.empty:
        raise DataError(f"dataset.path {path} has a header but no rows")
    cols = list(columns) if columns else [c for c in frame.columns if c != date_column]
    missing_cols = [c for c in cols if c not in frame.columns]
    if missing_cols or not cols:
        raise ConfigError(f"dataset.columns {missing_cols or cols} not found in {path}")
    frame = _numeric_columns(frame, cols, path)
    _check_dates(frame[date_column], date_column, path)
    fr = [float(f) for f in split_fractions]
    if len(fr) != 3 or min(fr) <= 0 or abs(sum(fr) - 1) > 1e-6:
        raise ConfigError(f"dataset.split_fractions must be 3 positive numbers summing to 1 "
                          f"(got {split_fractions})")
    n = len(frame)
    borders = (int(n * fr[0]), int(n * (fr[0] + fr[1])), n)
    if scaling == "public":
        _check_observed(frame[cols].iloc[borders[0]:borders[1]], path)
    spec = WindowSpec(window, mode, missing, missing_ratio, horizon, train_stride, test_stride,
                      privacy_unit)
    return build_series_task(Path(path).stem, frame, cols, date_column, borders, spec, scaling,
                             loc, scale, max_train_windows, max_test_windows)
