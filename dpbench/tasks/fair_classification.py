"""Classification with a protected attribute: class metrics plus group fairness metrics.

The test set yields (x, y, group); training batches are (x, y) as in ``classification``, so
the loss, the loop and every method are unchanged. Group metrics (Zhao et al. 2025, Sec. 5):

* ``group_accuracy``: accuracy within each group;
* ``group_accuracy_parity``: max_g acc_g - min_g acc_g (accuracy parity across groups);
* ``demographic_parity_gap``: max_g P(y_hat = pos | g) - min_g P(y_hat = pos | g).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dpbench.tasks import register_task
from dpbench.tasks.classification import Classification, classification_metrics


def group_metrics(pred: torch.Tensor, y: torch.Tensor, groups: torch.Tensor,
                  positive_class: int = 1) -> dict[str, Any]:
    """Return per-group accuracy and positive rate, accuracy parity and demographic parity."""
    acc, pos = [], []
    for g in torch.unique(groups).tolist():
        mask = groups == g
        acc.append(float((pred[mask] == y[mask]).float().mean()))
        pos.append(float((pred[mask] == positive_class).float().mean()))
    return {
        "group_accuracy": acc,
        "group_positive_rate": pos,
        "group_accuracy_parity": max(acc) - min(acc),
        "demographic_parity_gap": max(pos) - min(pos),
    }


@register_task("fair_classification")
class FairClassification(Classification):
    """Classification whose evaluation adds group metrics over the protected attribute."""

    def evaluate(self, model: nn.Module, loader: Any, device: torch.device,
                 predict: Any = None) -> dict[str, Any]:
        """Return classification metrics plus ``group_metrics`` on the test set's groups."""
        lp, y, (g, *_) = self.collect_predictions(model, loader, device, predict)
        metrics = classification_metrics(lp, y, num_classes=lp.shape[1])
        positive = int(self.settings.get("positive_class", 1))
        return {**metrics, **group_metrics(lp.argmax(dim=1), y, g, positive)}
