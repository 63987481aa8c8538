"""Skewed MNIST: one class kept at a fraction of its training examples (disparate impact).

Bagdasaryan et al. 2019 and Zhao et al. 2025 under-represent one digit (8 by default) in the
training (and validation) data only; the test set is untouched, so the under-represented
class's test accuracy measures the disparate impact of DP training. Which examples are kept
is fixed by ``SPLIT_SEED`` (not by the data).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import TensorDataset

from dpbench.data import register_dataset
from dpbench.data.base import SPLIT_SEED, TaskData
from dpbench.data.vision import build_mnist
from dpbench.errors import ConfigError


def skew_indices(labels: np.ndarray, skew_class: int, keep_fraction: float) -> np.ndarray:
    """Return sorted indices keeping round(keep_fraction * n_c) of class ``skew_class``."""
    members = np.flatnonzero(labels == skew_class)
    keep = int(round(keep_fraction * len(members)))
    kept = np.random.default_rng(SPLIT_SEED + 2).permutation(members)[:keep]
    return np.sort(np.concatenate([np.flatnonzero(labels != skew_class), kept]))


@register_dataset("skewed_mnist")
def build_skewed_mnist(root=None, download: bool = True, train_subset: int | None = None,
                       skew_class: int = 8, keep_fraction: float = 0.1) -> TaskData:
    """Return MNIST whose training set keeps ``keep_fraction`` of class ``skew_class``."""
    if not 0 <= int(skew_class) <= 9:
        raise ConfigError(f"dataset.skew_class must be a digit 0-9 (got {skew_class!r})")
    if not 0.0 < keep_fraction <= 1.0:
        raise ConfigError(f"dataset.keep_fraction must be in (0, 1] (got {keep_fraction!r})")
    data = build_mnist(root=root, download=download, train_subset=train_subset)
    x, y = data.train.tensors
    idx = torch.from_numpy(skew_indices(y.numpy(), int(skew_class), float(keep_fraction)))
    data.train = TensorDataset(x[idx], y[idx])
    data.name = "skewed_mnist"
    kept = int((y[idx] == skew_class).sum())
    data.notes = [*data.notes, f"skewed: class {skew_class} keeps {kept} of "
                  f"{int((y == skew_class).sum())} training examples; test set untouched"]
    data.extras["skew_class"] = int(skew_class)
    return data
