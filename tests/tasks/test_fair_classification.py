"""Fairness metrics against hand-computed confusion matrices."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpbench.tasks.classification import classification_metrics
from dpbench.tasks.fair_classification import FairClassification, group_metrics


def test_group_metrics_hand_computed():
    # group 0: TP 2, FN 1, FP 1, TN 2 -> acc 4/6, positive rate 3/6
    # group 1: TP 1, FN 1, FP 0, TN 2 -> acc 3/4, positive rate 1/4
    y = torch.tensor([1, 1, 1, 0, 0, 0, 1, 1, 0, 0])
    p = torch.tensor([1, 1, 0, 1, 0, 0, 1, 0, 0, 0])
    g = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1, 1])
    m = group_metrics(p, y, g)
    assert m["group_accuracy"] == pytest.approx([4 / 6, 3 / 4])
    assert m["group_positive_rate"] == pytest.approx([3 / 6, 1 / 4])
    assert m["group_accuracy_parity"] == pytest.approx(3 / 4 - 4 / 6)
    assert m["demographic_parity_gap"] == pytest.approx(3 / 6 - 1 / 4)


def test_class_metrics_hand_computed():
    # 3 classes; confusion rows (true) x cols (pred): [[3,1,0],[0,1,1],[0,0,2]]
    y = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])
    p = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    m = classification_metrics(torch.nn.functional.one_hot(p, 3).float().log(), y, 3)
    assert m["per_class_accuracy"] == pytest.approx([3 / 4, 1 / 2, 1.0])
    assert m["macro_accuracy"] == pytest.approx((3 / 4 + 1 / 2 + 1) / 3)
    assert m["worst_class_accuracy"] == pytest.approx(1 / 2)
    assert m["accuracy_parity"] == pytest.approx(1 / 2)
    assert m["accuracy"] == pytest.approx(6 / 8)


class _Lookup(nn.Module):
    """Predicts the class stored in the first input column."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(x[:, 0].long(), 2).float() * 10


def test_task_evaluate_reads_groups_from_the_test_set():
    y = torch.tensor([1, 1, 1, 0, 0, 0, 1, 1, 0, 0])
    p = torch.tensor([1, 1, 0, 1, 0, 0, 1, 0, 0, 0])
    g = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1, 1])
    loader = DataLoader(TensorDataset(p[:, None].float(), y, g), batch_size=3)
    m = FairClassification().evaluate(_Lookup(), loader, torch.device("cpu"))
    assert m["demographic_parity_gap"] == pytest.approx(0.25)
    assert m["accuracy"] == pytest.approx(0.7)
    assert m["per_class_accuracy"] == pytest.approx([4 / 5, 3 / 5])
