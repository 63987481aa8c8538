"""Book-keeping's Embedding rule (``rules/embedding.py``): the ghost norm over repeated
tokens, the padding row, and the refusal of frequency-scaled or sparse gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpbench.training.engine.rules.embedding import EmbeddingRule
from tests.training.engine.rules import grid


@pytest.mark.parametrize("i", range(3))
def test_embedding_draws_are_exact(i):
    grid.assert_bk_exact(grid.draw("embedding", i))


@pytest.mark.parametrize("padding_idx", [None, 0])
def test_embedding_repeated_tokens_and_padding_row_are_exact(padding_idx):
    torch.manual_seed(0)
    x = torch.tensor([[0, 1, 1, 3], [2, 2, 2, 0], [3, 0, 1, 3]])  # repeats and the padding row
    layer = nn.Embedding(4, 6, padding_idx=padding_idx)
    grid.assert_bk_exact(grid.Case(f"embedding padding_idx={padding_idx}", layer, x))


def test_embedding_called_twice_is_refused_by_bk():
    torch.manual_seed(1)
    case = grid.Case("embedding twice", grid.families.EmbeddingTwice(7, 5),
                     torch.randint(0, 7, (3, 4)))
    grid.assert_called_twice_refused(case)


@pytest.mark.parametrize("setting", ["scale_grad_by_freq", "sparse"])
def test_embedding_rule_and_its_refusals(setting):
    grid.assert_rule(nn.Embedding(5, 3), EmbeddingRule)
    # the float64 reference cannot add sparse gradients: the refusal alone for ``sparse``
    x = torch.randint(0, 5, (2, 3)) if setting == "scale_grad_by_freq" else None
    grid.assert_refused(nn.Embedding(5, 3, **{setting: True}),
                        "Embedding with scale_grad_by_freq or sparse gradients", x)


def test_embedding_two_points_hold_their_cross_terms():
    torch.manual_seed(3)
    grid.assert_calls_exact(nn.Embedding(5, 4, padding_idx=0),
                            [torch.randint(0, 5, (3, 4)), torch.randint(0, 5, (3, 4))],
                            [0.7, -1.3])
