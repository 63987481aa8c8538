"""Classification: cross-entropy per example; accuracy, per-class accuracy, NLL and calibration."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dpbench.tasks import register_task
from dpbench.tasks.base import Task
from dpbench.tasks.calibration import calibration_metrics
from dpbench.utils.tensors import move_to


@register_task("classification")
class Classification(Task):
    """Multiclass classification of (x, y) batches."""

    def per_example_loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch[0], batch[1]
        return F.cross_entropy(model(x), y, reduction="none")

    @torch.no_grad()
    def predict_log_proba(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(model(x), dim=-1)

    @torch.no_grad()
    def collect_predictions(self, model: nn.Module, loader: Any, device: torch.device,
                            predict: Any = None) -> tuple[torch.Tensor, torch.Tensor, list]:
        """Return (log-probs, labels, the batches' further tensors) over ``loader`` on CPU."""
        predict = predict or (lambda x: self.predict_log_proba(model, x))
        was_training = model.training
        model.eval()
        log_probs, labels, rest = [], [], []
        for batch in loader:
            x, y, *extra = move_to(batch, device)
            log_probs.append(predict(x).float().cpu())
            labels.append(y.cpu())
            rest.append([t.cpu() for t in extra])
        model.train(was_training)
        extras = [torch.cat(column) for column in zip(*rest)] if rest else []
        return torch.cat(log_probs), torch.cat(labels), extras

    def evaluate(self, model: nn.Module, loader: Any, device: torch.device,
                 predict: Any = None) -> dict[str, Any]:
        """Return accuracy, per-class accuracy, NLL, ECE, Brier; ``predict`` maps x -> log-probs."""
        lp, y, _ = self.collect_predictions(model, loader, device, predict)
        return classification_metrics(lp, y, num_classes=lp.shape[1])


def classification_metrics(log_probs: torch.Tensor, y: torch.Tensor,
                           num_classes: int) -> dict[str, Any]:
    """Return accuracy, per-class/macro/worst-class accuracy, parity, NLL, ECE (15 bins), Brier.

    ``accuracy_parity`` is the largest gap between two classes' accuracies (max - min).
    """
    pred = log_probs.argmax(dim=1)
    correct = (pred == y).float()
    per_class = []
    for c in range(num_classes):
        mask = y == c
        per_class.append(float(correct[mask].mean()) if mask.any() else float("nan"))
    present = [a for a in per_class if a == a]
    return {
        "accuracy": float(correct.mean()),
        "loss": float(F.nll_loss(log_probs, y)),
        "macro_accuracy": sum(present) / len(present),
        "worst_class_accuracy": min(present),
        "accuracy_parity": max(present) - min(present),
        "per_class_accuracy": per_class,
        **calibration_metrics(log_probs, y),
    }
