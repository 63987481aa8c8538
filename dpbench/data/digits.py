"""scikit-learn's bundled 8x8 handwritten digits: the offline default (no download, no root).

1797 real images (UCI optdigits test part), pixels 0..16 scaled by the fixed constant 1/16;
a fixed 80/20 split. The bundled file is parsed once per process (``_bundled_digits``); each
call builds new tensors from it, so no two runs share a tensor.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch.utils.data import TensorDataset

from dpbench.data import register_dataset
from dpbench.data.base import TaskData, fixed_split


@lru_cache(maxsize=1)
def _bundled_digits() -> tuple[np.ndarray, np.ndarray]:
    """Return scikit-learn's bundled (images, labels), read-only: parsing the file is most of
    a build's cost, and a sweep's seeds or an MIA cell's models build the data set again and
    again in one process. Nothing outside this module sees these arrays."""
    bunch = load_digits()
    images, target = np.array(bunch.images), np.array(bunch.target)
    images.flags.writeable = target.flags.writeable = False
    return images, target


@register_dataset("digits")
def build_digits(train_fraction: float = 0.8) -> TaskData:
    """Return the digits task: 1437 train / 360 test images of shape (1, 8, 8), in tensors of
    its own (``torch.tensor`` copies the bundled arrays; the split indexes copy again)."""
    images, target = _bundled_digits()
    x = torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(target, dtype=torch.long)
    tr, te = fixed_split(len(y), train_fraction)
    return TaskData(
        name="digits", task="classification",
        train=TensorDataset(x[tr], y[tr]), test=TensorDataset(x[te], y[te]),
        num_classes=10, input_shape=(1, 8, 8), class_names=[str(i) for i in range(10)],
    )
