"""Book-keeping's Conv2d rule (``rules/conv.py``): patches from one strided copy, ghost or
instantiated norms, torch's weight gradient per example for large layers, padding modes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpbench.training.engine.rules import conv
from dpbench.training.engine.rules.base import Call
from tests.training.engine.rules import grid


@pytest.mark.parametrize("i", range(3))
def test_conv2d_draws_are_exact(i):
    grid.assert_bk_exact(grid.draw("conv2d", i))


@pytest.mark.parametrize("layer,shape", [
    (lambda: nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), (3, 3, 6, 6)),
    (lambda: nn.Conv2d(4, 6, 3, stride=2, groups=2, padding_mode="circular", padding=1),
     (2, 4, 7, 7)),
    (lambda: nn.Conv2d(64, 64, 1, bias=False), (2, 64, 2, 2)),  # ghost: L small
], ids=["reflect", "circular grouped strided", "ghost"])
def test_conv2d_paths_are_exact(layer, shape):
    torch.manual_seed(0)
    grid.assert_bk_exact(grid.Case(str(shape), layer(), torch.randn(shape)))


def test_conv2d_large_layer_takes_the_per_example_weight_gradient(monkeypatch):
    """Above PER_EXAMPLE_CALL_MACS the rule calls torch's weight gradient per example."""
    monkeypatch.setattr(conv, "PER_EXAMPLE_CALL_MACS", 1)
    torch.manual_seed(1)
    grid.assert_bk_exact(grid.Case("conv per example", nn.Conv2d(3, 4, 3), torch.randn(3, 3, 6, 6)))


def test_conv2d_called_twice_is_refused_by_bk():
    torch.manual_seed(2)
    layer = grid.families.CalledTwice(nn.Conv2d(3, 3, 3, padding=1))
    grid.assert_called_twice_refused(grid.Case("conv twice", layer, torch.randn(2, 3, 6, 6)))


def test_conv2d_rule_and_its_padding_check():
    grid.assert_rule(nn.Conv2d(3, 4, 3), conv.Conv2dRule)
    layer = nn.Conv2d(3, 4, 3)
    layer.padding_mode = "mirror"  # set after construction: no padding the rule reads
    grid.assert_refused(layer, "Conv2d padding_mode 'mirror'")


@pytest.mark.parametrize("layer", [lambda: nn.Conv2d(3, 4, 3, padding=1, groups=1),
                                   lambda: nn.Conv2d(4, 4, 1, groups=2)], ids=["3x3", "1x1 g2"])
def test_conv2d_two_points_hold_their_cross_terms(layer):
    torch.manual_seed(3)
    grid.assert_calls_exact(layer(), [torch.randn(2, layer().in_channels, 5, 5)
                                      for _ in range(2)], [0.7, -1.3])


def test_only_cpu_loops_per_example_above_the_threshold():
    """The per-example weight-gradient loop is a CPU measurement; elsewhere one batched product."""
    big, small = conv.PER_EXAMPLE_CALL_MACS, conv.PER_EXAMPLE_CALL_MACS - 1
    assert conv.loops_per_example(torch.device("cpu"), big)
    assert not conv.loops_per_example(torch.device("cpu"), small)
    for name in ("cuda", "cuda:1", "mps", "meta"):
        assert not conv.loops_per_example(torch.device(name), big)


@pytest.mark.parametrize("layer", [lambda: nn.Conv2d(64, 64, 3, padding=1),
                                   lambda: nn.Conv2d(8, 12, 3, stride=2, groups=4, padding=1)],
                         ids=["resnet stage", "grouped strided"])
def test_the_batched_product_equals_the_per_example_loop_in_float64(layer):
    """What a GPU runs for a large layer (one bmm of the patches, eq. 2) equals what a CPU runs
    (torch's weight gradient per example), to float64 rounding, on a ResNet-stage shape."""
    torch.manual_seed(4)
    m = layer().double()
    a = torch.randn(3, m.in_channels, 16, 16, dtype=torch.float64)
    g = torch.randn(m(a).shape, dtype=torch.float64)
    calls = [Call(a, g), Call(a.flip(0), g.flip(0))]
    looped = conv._per_example_loop(m, calls, m.weight.shape)
    batched = conv._instantiated(conv._patch_operands(m, calls)).view(looped.shape)
    length = sum(c.g.shape[2] * c.g.shape[3] for c in calls)  # the sum's terms per entry
    tol = length * torch.finfo(torch.float64).eps * float(looped.abs().max())
    assert float((batched - looped).abs().max()) <= tol
