"""Book-keeping's Linear rule (``rules/linear.py``): ghost or instantiated norms, one call or
several concatenated along the tokens, against the float64 reference."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpbench.training.engine.rules.linear import LinearRule
from tests.training.engine.rules import grid


@pytest.mark.parametrize("i", range(3))
def test_linear_draws_are_exact(i):
    grid.assert_bk_exact(grid.draw("linear", i))


@pytest.mark.parametrize("shape", [(3, 7), (3, 2, 7), (2, 40, 7)], ids=str)
def test_linear_one_call_both_norm_paths(shape):
    """T = 1 closed form, instantiation (T (d_in + d_out) > d_in d_out) and the ghost norm."""
    torch.manual_seed(0)
    layer = nn.Linear(7, 5) if shape[1] != 40 else nn.Linear(7, 200)
    grid.assert_bk_exact(grid.Case(f"linear {shape}", layer, torch.randn(shape)))


def test_linear_called_twice_concatenates_its_calls():
    torch.manual_seed(1)
    case = grid.Case("linear twice", grid.families.CalledTwice(nn.Linear(6, 6)), torch.randn(3, 6))
    grid.assert_bk_exact(case)


def test_linear_rule_and_its_refusals():
    grid.assert_rule(nn.Linear(3, 2), LinearRule)
    assert LinearRule.concat_calls
    grid.assert_refused(grid.families.DoubledLinear(3, 2), "with its own forward",
                        torch.randn(2, 3))
    grid.assert_refused(nn.utils.weight_norm(nn.Linear(3, 2)), "weight_g")


@pytest.mark.parametrize("shape", [(3, 7), (3, 4, 7)], ids=str)
def test_linear_two_points_hold_their_cross_terms(shape):
    torch.manual_seed(3)
    grid.assert_calls_exact(nn.Linear(7, 5), [torch.randn(shape), torch.randn(shape)],
                            [0.7, -1.3])
