"""Logistic regression and a small MLP (tanh), for tabular data and 8x8 digits."""

from __future__ import annotations

import math

from torch import nn

from dpbench.models import register_model


@register_model("logreg")
def logistic_regression(input_shape, num_classes: int) -> nn.Module:
    """Return flatten + one linear layer (multinomial logistic regression)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


@register_model("mlp")
def mlp(input_shape, num_classes: int, hidden: int = 64, depth: int = 1) -> nn.Module:
    """Return an MLP with ``depth`` tanh hidden layers of width ``hidden``."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.Tanh()]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)
