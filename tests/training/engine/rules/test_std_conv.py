"""Book-keeping's rules for timm's weight-standardised convolutions (``rules/std_conv.py``):
the standardisation's Jacobian and the learned gain."""

from __future__ import annotations

import pytest
import torch

from dpbench.training.engine.rules.std_conv import ScaledStdConvRule, StdConvRule
from tests.training.engine.rules import grid

timm = pytest.importorskip("timm")


@pytest.mark.parametrize("i", range(3))
def test_std_conv_draws_are_exact(i):
    grid.assert_bk_exact(grid.draw("std_conv2d", i))


def test_std_conv_called_twice_is_refused_by_bk():
    torch.manual_seed(0)
    layer = grid.families.CalledTwice(timm.layers.StdConv2d(3, 3, 3, padding=1))
    grid.assert_called_twice_refused(grid.Case("std_conv twice", layer, torch.randn(2, 3, 6, 6)))


def test_std_conv_rules_and_their_checks():
    grid.assert_rule(timm.layers.StdConv2d(3, 4, 3), StdConvRule)
    grid.assert_rule(timm.layers.ScaledStdConv2d(3, 4, 3), ScaledStdConvRule)
    assert "gain" in ScaledStdConvRule.parameters and "gain" not in StdConvRule.parameters
    layer = timm.layers.StdConv2d(3, 4, 3)
    layer.padding_mode = "mirror"
    grid.assert_refused(layer, "StdConv2d padding_mode 'mirror'")

    class OwnStdConv(timm.layers.StdConv2d):
        def forward(self, x):
            return super().forward(2 * x)

    grid.assert_refused(OwnStdConv(3, 4, 3), "subclasses StdConv2d with its own forward")


def test_scaled_std_conv_two_points_hold_their_cross_terms():
    torch.manual_seed(3)
    layer = timm.layers.ScaledStdConv2d(3, 4, 3, padding=1)
    with torch.no_grad():
        layer.gain.normal_(1.0, 0.3)
    grid.assert_calls_exact(layer, [torch.randn(2, 3, 5, 5), torch.randn(2, 3, 5, 5)],
                            [0.7, -1.3])
