"""scikit-learn's bundled 8x8 handwritten digits: the offline default (no download, no root).

1797 real images (UCI optdigits test part), pixels 0..16 scaled by the fixed constant 1/16;
a fixed 80/20 split.
"""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits
from torch.utils.data import TensorDataset

from dpbench.data import register_dataset
from dpbench.data.base import TaskData, fixed_split


@register_dataset("digits")
def build_digits(train_fraction: float = 0.8) -> TaskData:
    """Return the digits task: 1437 train / 360 test images of shape (1, 8, 8)."""
    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.long)
    tr, te = fixed_split(len(y), train_fraction)
    return TaskData(
        name="digits", task="classification",
        train=TensorDataset(x[tr], y[tr]), test=TensorDataset(x[te], y[te]),
        num_classes=10, input_shape=(1, 8, 8), class_names=[str(i) for i in range(10)],
    )
