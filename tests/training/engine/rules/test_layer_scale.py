"""Book-keeping's rule for timm's LayerScale (``rules/layer_scale.py``): ``y = x * gamma``."""

from __future__ import annotations

import pytest
import torch

from dpbench.training.engine.rules.layer_scale import LayerScaleRule
from tests.training.engine.rules import grid

timm = pytest.importorskip("timm")


@pytest.mark.parametrize("shape", [(3, 6), (3, 4, 6), (2, 3, 2, 6)], ids=str)
def test_layer_scale_is_exact(shape):
    torch.manual_seed(0)
    layer = grid.families._randomised(timm.layers.LayerScale(6, init_values=0.5))
    grid.assert_bk_exact(grid.Case(f"layer_scale {shape}", layer, torch.randn(shape)))


def test_layer_scale_rule_and_its_in_place_refusal():
    grid.assert_rule(timm.layers.LayerScale(4), LayerScaleRule)
    grid.assert_refused(timm.layers.LayerScale(4, inplace=True),
                        "LayerScale(inplace=True) overwrites its input")


def test_layer_scale_two_points_hold_their_cross_terms():
    layer = grid.families._randomised(timm.layers.LayerScale(6, init_values=0.5))
    grid.assert_calls_exact(layer, [torch.randn(3, 4, 6), torch.randn(3, 4, 6)], [0.7, -1.3])
