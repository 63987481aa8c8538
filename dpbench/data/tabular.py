"""Tabular fairness benchmarks: UCI Adult, Dutch census 2001 and CelebA attributes.

Every encoding is fixed by the published schema, never learned from the (private) data:
categorical columns are one-hot over the category lists written below (from ``adult.names``
and the ARFF header of the Dutch census; a missing or unknown value is the all-zero vector),
numeric columns are min-max scaled by the fixed published ranges in ``ADULT_NUMERIC`` and
clipped to [0, 1]. The protected attribute (sex/gender, or CelebA's ``Male``) is returned as
the third tensor of the *test* set (group index 0/1) and named in ``TaskData.extras``; the task
``fair_classification`` computes group metrics from it (dpbench/tasks/fair_classification.py).
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.utils.data import TensorDataset

from dpbench.data import register_dataset
from dpbench.data.base import TaskData, fixed_split, read_failed, resolve_data_root, subset_indices
from dpbench.errors import ConfigError, DataError

FAIR_TASK = "fair_classification"

# ---- UCI Adult (adult.names) ------------------------------------------------------------
ADULT_COLUMNS = ["age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
                 "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
                 "hours-per-week", "native-country", "income"]
ADULT_CATEGORIES: dict[str, list[str]] = {
    "workclass": ["Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov",
                  "State-gov", "Without-pay", "Never-worked"],
    "education": ["Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm",
                  "Assoc-voc", "9th", "7th-8th", "12th", "Masters", "1st-4th", "10th",
                  "Doctorate", "5th-6th", "Preschool"],
    "marital-status": ["Married-civ-spouse", "Divorced", "Never-married", "Separated",
                       "Widowed", "Married-spouse-absent", "Married-AF-spouse"],
    "occupation": ["Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial",
                   "Prof-specialty", "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical",
                   "Farming-fishing", "Transport-moving", "Priv-house-serv", "Protective-serv",
                   "Armed-Forces"],
    "relationship": ["Wife", "Own-child", "Husband", "Not-in-family", "Other-relative",
                     "Unmarried"],
    "race": ["White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other", "Black"],
    "sex": ["Female", "Male"],
    "native-country": ["United-States", "Cambodia", "England", "Puerto-Rico", "Canada",
                       "Germany", "Outlying-US(Guam-USVI-etc)", "India", "Japan", "Greece",
                       "South", "China", "Cuba", "Iran", "Honduras", "Philippines", "Italy",
                       "Poland", "Jamaica", "Vietnam", "Mexico", "Portugal", "Ireland",
                       "France", "Dominican-Republic", "Laos", "Ecuador", "Taiwan", "Haiti",
                       "Columbia", "Hungary", "Guatemala", "Nicaragua", "Scotland", "Thailand",
                       "Yugoslavia", "El-Salvador", "Trinadad&Tobago", "Peru", "Hong",
                       "Holand-Netherlands"],
}
#: fixed ranges of the published UCI Adult attributes (fnlwgt, a census sampling weight, is
#: not a personal attribute and is left out)
ADULT_NUMERIC: dict[str, tuple[float, float]] = {
    "age": (17.0, 90.0), "education-num": (1.0, 16.0), "capital-gain": (0.0, 99999.0),
    "capital-loss": (0.0, 4356.0), "hours-per-week": (1.0, 99.0),
}

# ---- Dutch census 2001 (ARFF header of dutch_census_2001.arff) --------------------------
DUTCH_CATEGORIES: dict[str, list[str]] = {
    "sex": ["1", "2"],  # 1 male, 2 female
    "age": [str(i) for i in range(1, 18)],
    "household_position": ["1110", "1121", "1122", "1131", "1132", "1140", "1210", "1220"],
    "household_size": ["111", "112", "113", "114", "125", "126"],
    "prev_residence_place": ["1", "2", "9"],
    "citizenship": ["1", "2", "3"],
    "country_birth": ["1", "2", "3"],
    "edu_level": ["0", "1", "2", "3", "4", "5", "9"],
    "economic_status": ["111", "112", "120", "210", "221", "222", "223", "224"],
    "cur_eco_activity": ["111", "122", "124", "131", "132", "133", "134", "135", "136", "137",
                         "138", "139", "200"],
    "Marital_status": ["1", "2", "3", "4"],
}
DUTCH_OCCUPATIONS = ("2_1", "5_4_9")


def one_hot(frame: pd.DataFrame, categories: dict[str, Sequence[str]]) -> np.ndarray:
    """Return the one-hot block of ``frame`` over the fixed category lists (unknown -> 0s)."""
    blocks = []
    for column, values in categories.items():
        # position in the fixed list, -1 for a value outside it (a pd.Categorical built from
        # such values is deprecated in pandas 3)
        codes = pd.Index(list(values)).get_indexer(frame[column].astype(str))
        block = np.zeros((len(frame), len(values)), dtype=np.float32)
        known = codes >= 0
        block[np.flatnonzero(known), codes[known]] = 1.0
        blocks.append(block)
    return np.concatenate(blocks, axis=1)


def scale_fixed(frame: pd.DataFrame, ranges: dict[str, tuple[float, float]]) -> np.ndarray:
    """Return (x - lo) / (hi - lo) clipped to [0, 1] with the fixed published ranges."""
    cols = [((frame[c].astype(np.float32) - lo) / (hi - lo)).clip(0, 1).to_numpy()
            for c, (lo, hi) in ranges.items()]
    return np.stack(cols, axis=1).astype(np.float32)


def _fair_task(name: str, xtr, ytr, xte, yte, gte, protected: str, group_names: list[str],
               class_names: list[str], notes: list[str], train_subset: int | None) -> TaskData:
    keep = subset_indices(len(ytr), train_subset)
    if train_subset is not None:
        notes = [*notes, f"training on a fixed subset of {len(keep)} examples"]
    as_x = lambda a: torch.as_tensor(a, dtype=torch.float32)  # noqa: E731
    as_y = lambda a: torch.as_tensor(a, dtype=torch.long)  # noqa: E731
    return TaskData(
        name=name, task=FAIR_TASK,
        train=TensorDataset(as_x(xtr[keep]), as_y(ytr[keep])),
        test=TensorDataset(as_x(xte), as_y(yte), as_y(gte)),
        num_classes=2, input_shape=(int(xtr.shape[1]),), class_names=class_names,
        notes=notes, extras={"protected_attribute": protected, "group_names": group_names},
    )


def _root(root, folder: str, name: str) -> Path:
    path = resolve_data_root(root)
    if path is None or not (path / folder).is_dir():
        raise DataError(f"{name} not found under {path / folder if path else '(no data root)'}"
                        "; set paths.data_root (or DPBENCH_DATA_ROOT) to a folder holding "
                        f"{folder}/ (there is no download for tabular data)")
    return path / folder


# ---- loaders ----------------------------------------------------------------------------
def _read_adult(path: Path, skiprows: int) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path, header=None, names=ADULT_COLUMNS, skipinitialspace=True,
                            na_values="?", skiprows=skiprows)
    except Exception as err:
        raise read_failed(path, err) from err
    frame = frame.dropna(subset=["income"])
    frame["income"] = frame["income"].str.rstrip(".")
    return frame


def _encode_adult(frame: pd.DataFrame, include_protected: bool):
    cats = {k: v for k, v in ADULT_CATEGORIES.items() if include_protected or k != "sex"}
    x = np.concatenate([scale_fixed(frame, ADULT_NUMERIC), one_hot(frame, cats)], axis=1)
    y = (frame["income"] == ">50K").to_numpy().astype(np.int64)
    g = (frame["sex"] == "Female").to_numpy().astype(np.int64)  # group 1: female
    return x, y, g


@register_dataset("adult")
def build_adult(root=None, include_protected: bool = True,
                train_subset: int | None = None) -> TaskData:
    """Return UCI Adult (income > 50K) with the official train/test files; group: sex."""
    folder = _root(root, "adult", "UCI Adult")
    xtr, ytr, _ = _encode_adult(_read_adult(folder / "adult.data", 0), include_protected)
    xte, yte, gte = _encode_adult(_read_adult(folder / "adult.test", 1), include_protected)
    return _fair_task("adult", xtr, ytr, xte, yte, gte, "sex", ["male", "female"],
                      ["<=50K", ">50K"], [], train_subset)


def _read_arff(path: Path) -> pd.DataFrame:
    try:
        lines = path.read_text().splitlines()
        names = [ln.split()[1] for ln in lines if ln.lower().startswith("@attribute")]
        start = next(i for i, ln in enumerate(lines) if ln.strip().lower() == "@data") + 1
        rows = [ln.split(",") for ln in lines[start:] if ln.strip()]
    except (OSError, StopIteration, IndexError) as err:
        raise read_failed(path, err) from err
    return pd.DataFrame(rows, columns=names)


@register_dataset("dutch")
def build_dutch(root=None, positive_occupation: str = "2_1", include_protected: bool = True,
                train_fraction: float = 0.8, train_subset: int | None = None) -> TaskData:
    """Return the Dutch census 2001 (label: occupation) on a fixed split; group: sex."""
    if positive_occupation not in DUTCH_OCCUPATIONS:
        raise ConfigError(f"dataset.positive_occupation must be one of {DUTCH_OCCUPATIONS} "
                          f"(got {positive_occupation!r})")
    frame = _read_arff(_root(root, "dutch", "Dutch census") / "dutch_census_2001.arff")
    cats = {k: v for k, v in DUTCH_CATEGORIES.items() if include_protected or k != "sex"}
    x = one_hot(frame, cats)
    y = (frame["occupation"] == positive_occupation).to_numpy().astype(np.int64)
    g = (frame["sex"] == "2").to_numpy().astype(np.int64)  # group 1: female
    tr, te = fixed_split(len(y), train_fraction)
    notes = [f"Dutch census: fixed {train_fraction:.0%} train split of {len(y)} rows"]
    return _fair_task("dutch", x[tr], y[tr], x[te], y[te], g[te], "sex", ["male", "female"],
                      [f"not {positive_occupation}", positive_occupation], notes, train_subset)


@register_dataset("celeba_attributes")
def build_celeba_attributes(root=None, target: str = "Attractive", protected: str = "Male",
                            include_protected: bool = True,
                            train_subset: int | None = None) -> TaskData:
    """Return CelebA attribute prediction: ``target`` from the other attributes (no images).

    Official partition: train = 0, test = 2 (validation rows are not used).
    """
    folder = _root(root, "celeba", "CelebA attributes")
    path = folder / "list_attr_celeba.zip"
    try:
        with zipfile.ZipFile(path) as zf, zf.open("list_attr_celeba.txt") as f:
            frame = pd.read_csv(f, sep=r"\s+", skiprows=1)
        part = pd.read_csv(folder / "list_eval_partition.txt", sep=" ", header=None,
                           index_col=0).iloc[:, 0]
    except Exception as err:
        raise read_failed(path, err) from err
    for key, name in (("target", target), ("protected", protected)):
        if name not in frame.columns:
            raise ConfigError(f"dataset.{key} must be a CelebA attribute, one of "
                              f"{', '.join(frame.columns)} (got {name!r})")
    if target == protected:
        raise ConfigError("dataset.target and dataset.protected must differ")
    drop = [target] + ([] if include_protected else [protected])
    x = (frame.drop(columns=drop).to_numpy(dtype=np.float32) + 1.0) / 2.0  # -1/1 -> 0/1
    y = (frame[target].to_numpy() > 0).astype(np.int64)
    g = (frame[protected].to_numpy() > 0).astype(np.int64)
    split = part.reindex(frame.index).to_numpy()
    tr, te = np.flatnonzero(split == 0), np.flatnonzero(split == 2)
    notes = ["CelebA: attributes only (no images); predicting "
             f"{target} from the other attributes"]
    return _fair_task("celeba_attributes", x[tr], y[tr], x[te], y[te], g[te], protected,
                      [f"not {protected}", protected], [f"not {target}", target], notes,
                      train_subset)
