"""What a data set hands the loop, and helpers shared by the loaders."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset, Subset

from dpbench.errors import DataError

#: seed of every fixed (data-independent) split, so all runs and seeds share the same split
SPLIT_SEED = 20240601


@dataclass
class TaskData:
    """Train and test sets plus what models and metrics need to know about them."""

    name: str
    task: str  # task kind, e.g. "classification"; methods declare which kinds they support
    train: Dataset
    test: Dataset
    num_classes: int = 0
    input_shape: tuple[int, ...] = ()
    class_names: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. "trained on a split of the test set"
    extras: dict[str, Any] = field(default_factory=dict)  # e.g. protected-group labels

    def __len__(self) -> int:
        return len(self.train)  # type: ignore[arg-type]


def resolve_data_root(root: str | os.PathLike | None) -> Path | None:
    """Return the data root as a path (None if unset)."""
    if root in (None, "", "null"):
        return None
    return Path(os.path.expanduser(str(root)))


def fixed_split(n: int, train_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Return (train, test) indices of a permutation fixed by SPLIT_SEED, not by the data."""
    perm = np.random.default_rng(SPLIT_SEED).permutation(n)
    cut = int(round(train_fraction * n))
    return perm[:cut], perm[cut:]


def subset_indices(n: int, size: int | None) -> np.ndarray:
    """Return the first ``size`` indices of a fixed permutation (all when size is None)."""
    if size is None or size >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(SPLIT_SEED + 1).permutation(n)[:size])


#: seed of the fixed validation split carved from a training set (tuning; see carve_validation)
VALIDATION_SPLIT_SEED = SPLIT_SEED + 11
#: tasks whose evaluation reads only the test items (so a carved validation set can stand in)
VALIDATION_TASKS = ("classification", "text_classification", "fair_classification")


def carve_validation(data: TaskData, fraction: float) -> TaskData:
    """Return ``data`` with a fixed validation split of its training set in place of the test set.

    The split is a permutation fixed by VALIDATION_SPLIT_SEED (data-independent, the same for
    every run, seed and method), so tuning never reads the test split and the validation
    examples never train. The privacy accounting then covers the remaining training part.
    """
    if data.task not in VALIDATION_TASKS:
        raise DataError(f"evaluation.split=validation supports the tasks "
                        f"{', '.join(VALIDATION_TASKS)} (data set {data.name!r} is a "
                        f"{data.task!r} task)")
    n = len(data.train)  # type: ignore[arg-type]
    train, val = validation_indices(n, fraction)
    size = len(val)
    if not 0 < size < n:
        raise DataError(f"evaluation.validation_fraction={fraction} leaves no validation or no "
                        f"training examples out of N = {n}")
    note = (f"evaluated on a fixed validation split: {size} of the {n} training examples "
            f"(seed {VALIDATION_SPLIT_SEED}); the test split is not read")
    return TaskData(name=data.name, task=data.task, train=Subset(data.train, train.tolist()),
                    test=Subset(data.train, val.tolist()), num_classes=data.num_classes,
                    input_shape=data.input_shape, class_names=data.class_names,
                    notes=[*data.notes, note], extras=dict(data.extras))


def validation_indices(n: int, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Return (train, validation) indices of carve_validation for a training set of size n."""
    size = int(round(fraction * n))
    perm = np.random.default_rng(VALIDATION_SPLIT_SEED).permutation(n)
    return np.sort(perm[size:]), np.sort(perm[:size])


def read_failed(path: Path, err: Exception) -> DataError:
    """Return the DataError for a file that could not be read, saying why (not always corrupt)."""
    if isinstance(err, PermissionError):
        return DataError(f"cannot read {path}: permission denied (check the file's owner "
                         "and mode)")
    if isinstance(err, IsADirectoryError):
        return DataError(f"cannot read {path}: it is a directory, not a data file")
    if isinstance(err, FileNotFoundError):
        return DataError(f"cannot read {path}: the file is missing")
    return DataError(f"cannot read {path}: the file is corrupt or truncated ({err})")
