"""Calibration metrics (ECE, NLL, Brier, reliability bins) against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from dpbench.tasks.calibration import (
    brier_score,
    calibration_metrics,
    expected_calibration_error,
    reliability_bins,
)
from dpbench.tasks.classification import classification_metrics

# five predictions; confidences 0.70, 0.50, 0.82, 0.42, 0.72 (bins 10, 7, 12, 6, 10 of 15)
PROBS = torch.tensor([[0.70, 0.20, 0.10],
                      [0.50, 0.30, 0.20],
                      [0.09, 0.82, 0.09],
                      [0.29, 0.29, 0.42],
                      [0.72, 0.18, 0.10]], dtype=torch.float64)
LABELS = torch.tensor([0, 1, 1, 0, 1])
# by hand: bin 10 holds 0.70 (right) and 0.72 (wrong): |0.5 - 0.71| with weight 2/5;
# the others |1 - 0.82|, |0 - 0.50|, |0 - 0.42| with weight 1/5 each.
ECE_BY_HAND = (2 * 0.21 + 0.18 + 0.50 + 0.42) / 5  # 0.304
NLL_BY_HAND = -(math.log(0.70) + math.log(0.30) + math.log(0.82) + math.log(0.29)
                + math.log(0.18)) / 5
BRIER_BY_HAND = (0.14 + 0.78 + 0.0486 + 0.7646 + 1.2008) / 5  # 0.5868


def test_ece_matches_hand_computed_value():
    assert expected_calibration_error(PROBS, LABELS) == pytest.approx(ECE_BY_HAND, abs=1e-6)


def test_brier_and_nll_match_hand_computed_values():
    assert brier_score(PROBS, LABELS) == pytest.approx(BRIER_BY_HAND, abs=1e-9)
    m = calibration_metrics(PROBS.log(), LABELS)
    assert m["nll"] == pytest.approx(NLL_BY_HAND, abs=1e-9)
    assert m["ece"] == pytest.approx(ECE_BY_HAND, abs=1e-6)


def test_reliability_bins_reproduce_the_ece():
    bins = reliability_bins(PROBS, LABELS)
    assert bins["count"][10] == 2 and bins["accuracy"][10] == 0.5
    assert bins["confidence"][10] == pytest.approx(0.71)
    assert sum(bins["count"]) == 5 and math.isnan(bins["accuracy"][0])
    ece = sum(c / 5 * abs(a - f) for c, a, f in
              zip(bins["count"], bins["accuracy"], bins["confidence"]) if c)
    assert ece == pytest.approx(ECE_BY_HAND, abs=1e-9)


def test_classification_metrics_carry_calibration_for_every_method():
    m = classification_metrics(PROBS.float().log(), LABELS, num_classes=3)
    assert m["accuracy"] == pytest.approx(0.4)
    assert m["nll"] == pytest.approx(m["loss"]) and m["ece"] == pytest.approx(ECE_BY_HAND)
    assert len(m["reliability_count"]) == 15



def test_ece_equals_torchmetrics_including_bin_edges():
    """The hand-binned ECE (no torchmetrics import at run time) equals torchmetrics' own."""
    from torchmetrics.functional.classification import multiclass_calibration_error

    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(500, 4, generator=gen), dim=1)
    edges = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.4, 0.2, 0.2, 0.2],
                          [2 / 3, 1 / 3, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    probs = torch.cat([probs, edges])  # confidence exactly on a bin edge, and 1.0
    labels = torch.randint(0, 4, (len(probs),), generator=gen)
    for n_bins in (15, 10, 7):
        ref = float(multiclass_calibration_error(probs, labels, num_classes=4, n_bins=n_bins,
                                                 norm="l1"))
        assert expected_calibration_error(probs, labels, n_bins) == pytest.approx(ref, abs=1e-6)
