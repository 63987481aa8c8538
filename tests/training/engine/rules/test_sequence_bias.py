"""Book-keeping's rule for Opacus's SequenceBias (``rules/sequence_bias.py``): a learned bias
appended as the last token."""

from __future__ import annotations

import pytest
import torch
from opacus.layers import SequenceBias

from dpbench.training.engine.rules.sequence_bias import SequenceBiasRule
from tests.training.engine.rules import grid


@pytest.mark.parametrize("i", range(3))
def test_sequence_bias_draws_are_exact(i):
    grid.assert_bk_exact(grid.draw("sequence_bias", i))


def test_sequence_bias_rule_and_its_time_first_refusal():
    grid.assert_rule(SequenceBias(4, batch_first=True), SequenceBiasRule)
    grid.assert_refused(SequenceBias(4, batch_first=False),
                        "SequenceBias(batch_first=False) is time-first")


def test_sequence_bias_two_points_hold_their_cross_terms():
    layer = SequenceBias(4, batch_first=True)
    with torch.no_grad():
        layer.bias.normal_()
    grid.assert_calls_exact(layer, [torch.randn(3, 5, 4), torch.randn(3, 5, 4)], [0.7, -1.3])
