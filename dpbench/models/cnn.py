"""The standard 2-layer tanh CNN of the DP literature (Papernot et al. 2021, Table 1).

conv 16@8x8 stride 2 pad 3 -> tanh -> maxpool 2x2 stride 1 -> conv 32@4x4 stride 2 -> tanh ->
maxpool 2x2 stride 1 -> fc 32 -> tanh -> fc classes. Works on 28x28 (MNIST) and 32x32 inputs.
"""

from __future__ import annotations

import torch
from torch import nn

from dpbench.models import register_model


@register_model("cnn2")
def cnn2(input_shape, num_classes: int, channels: tuple[int, int] = (16, 32),
         hidden: int = 32) -> nn.Module:
    """Return the 2-layer tanh CNN sized for ``input_shape`` (C, H, W)."""
    c1, c2 = channels
    features = nn.Sequential(
        nn.Conv2d(input_shape[0], c1, 8, stride=2, padding=3), nn.Tanh(),
        nn.MaxPool2d(2, 1),
        nn.Conv2d(c1, c2, 4, stride=2), nn.Tanh(),
        nn.MaxPool2d(2, 1),
        nn.Flatten(),
    )
    with torch.no_grad():
        flat = features(torch.zeros(1, *input_shape)).shape[1]
    return nn.Sequential(features, nn.Linear(flat, hidden), nn.Tanh(),
                         nn.Linear(hidden, num_classes))
