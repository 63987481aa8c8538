"""Book-keeping's rules for normalisation layers (``rules/norm.py``): LayerNorm, GroupNorm,
RMSNorm, timm's LayerNorm and LayerNorm2d (over the channels of NCHW)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpbench.training.engine.rules.norm import ChannelsFirstNormRule, NormRule
from tests.training.engine.rules import grid

timm = pytest.importorskip("timm")


@pytest.mark.parametrize("family", ["layer_norm", "group_norm", "rms_norm", "layer_norm2d"])
@pytest.mark.parametrize("i", range(2))
def test_norm_draws_are_exact(family, i):
    grid.assert_bk_exact(grid.draw(family, i, count=2))


@pytest.mark.parametrize("layer,shape", [
    (lambda: nn.RMSNorm([3, 5]), (4, 2, 3, 5)),
    (lambda: nn.RMSNorm(6, eps=1e-3), (4, 6)),
    (lambda: timm.layers.LayerNorm(6), (3, 2, 6)),
    (lambda: timm.layers.LayerNorm2d(5), (3, 5, 4, 3)),
], ids=["rms_norm 2 dims", "rms_norm eps", "timm.LayerNorm", "timm.LayerNorm2d"])
def test_norm_layers_are_exact(layer, shape):
    torch.manual_seed(0)
    module = layer()
    grid.families._randomise(module)
    grid.assert_bk_exact(grid.Case(str(shape), module, torch.randn(shape)))


def test_layer_norm_called_twice_is_refused_by_bk():
    torch.manual_seed(1)
    layer = grid.families.CalledTwice(grid.families._randomised(nn.LayerNorm(6)))
    grid.assert_called_twice_refused(grid.Case("layer_norm twice", layer, torch.randn(3, 6)))


def test_only_layer_norm2d_normalises_over_the_channels():
    for layer in (nn.LayerNorm(4), nn.GroupNorm(2, 4), nn.RMSNorm(4), timm.layers.LayerNorm(4)):
        grid.assert_rule(layer, NormRule)
    grid.assert_rule(timm.layers.LayerNorm2d(4), ChannelsFirstNormRule)
    assert ChannelsFirstNormRule.channels_first and not NormRule.channels_first


def test_a_norm_with_an_extra_parameter_is_refused():
    class Shifted(timm.layers.LayerNorm2d):
        def __init__(self, c: int) -> None:
            super().__init__(c)
            self.shift = nn.Parameter(torch.zeros(c))

    grid.assert_refused(Shifted(3), "trainable parameters shift no rule covers")


@pytest.mark.parametrize("layer,shape", [
    (lambda: nn.LayerNorm(6), (3, 2, 6)),
    (lambda: nn.GroupNorm(2, 4), (3, 4, 3, 3)),
    (lambda: timm.layers.LayerNorm2d(4), (3, 4, 3, 3)),
], ids=["layer_norm", "group_norm", "timm.LayerNorm2d"])
def test_norm_two_points_hold_their_cross_terms(layer, shape):
    torch.manual_seed(3)
    module = grid.families._randomised(layer())
    grid.assert_calls_exact(module, [torch.randn(shape), torch.randn(shape)], [0.7, -1.3])
