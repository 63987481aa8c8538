"""What a data set hands the loop, and helpers shared by the loaders."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

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
