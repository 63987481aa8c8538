"""Book-keeping's Conv1d rule (``rules/conv1d.py``): the Conv2d rule on a height-1 view."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpbench.training.engine.rules.conv1d import Conv1dRule
from tests.training.engine.rules import grid


@pytest.mark.parametrize("i", range(3))
def test_conv1d_draws_are_exact(i):
    grid.assert_bk_exact(grid.draw("conv1d", i))


@pytest.mark.parametrize("layer,shape", [
    (lambda: nn.Conv1d(3, 4, 3, padding=2, padding_mode="reflect"), (4, 3, 9)),
    (lambda: nn.Conv1d(4, 6, 3, stride=2, dilation=2, padding=1, padding_mode="circular",
                       groups=2), (3, 4, 11)),
    (lambda: nn.Conv1d(2, 3, 4, padding="same"), (3, 2, 8)),
], ids=["reflect", "circular strided dilated", "same even kernel"])
def test_conv1d_padding_modes_are_exact(layer, shape):
    torch.manual_seed(0)
    grid.assert_bk_exact(grid.Case(str(shape), layer(), torch.randn(shape)))


def test_conv1d_rule_and_its_padding_check():
    grid.assert_rule(nn.Conv1d(3, 4, 3), Conv1dRule)
    layer = nn.Conv1d(3, 4, 3)
    layer.padding_mode = "mirror"
    grid.assert_refused(layer, "Conv1d padding_mode 'mirror'")


def test_conv1d_two_points_hold_their_cross_terms():
    torch.manual_seed(3)
    grid.assert_calls_exact(nn.Conv1d(3, 4, 3, padding=1),
                            [torch.randn(2, 3, 7), torch.randn(2, 3, 7)], [0.7, -1.3])
