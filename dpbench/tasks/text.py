"""Text classification: batches are (input_ids, attention_mask, label) tuples of tensors."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dpbench.tasks import register_task
from dpbench.tasks.base import Task
from dpbench.tasks.classification import classification_metrics
from dpbench.utils.tensors import move_to


@register_task("text_classification")
class TextClassification(Task):
    """Cross-entropy per example of a model mapping (input_ids, attention_mask) to logits."""

    def per_example_loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        input_ids, attention_mask, y = batch[0], batch[1], batch[2]
        logits = model(input_ids=input_ids, attention_mask=attention_mask)
        return F.cross_entropy(logits, y, reduction="none")

    @torch.no_grad()
    def collect_predictions(self, model: nn.Module, loader: Any, device: torch.device,
                            predict: Any = None) -> tuple[torch.Tensor, torch.Tensor, list]:
        """Return (log-probs, labels, []) over ``loader`` on CPU; ``predict`` maps
        (input_ids, attention_mask) to logits (the classification task's interface, which
        the membership-inference scorer reads)."""
        was_training = model.training
        model.eval()
        log_probs, labels = [], []
        for batch in loader:
            input_ids, attention_mask, y = move_to(batch, device)[:3]
            logits = (predict(input_ids, attention_mask) if predict is not None
                      else model(input_ids=input_ids, attention_mask=attention_mask))
            log_probs.append(F.log_softmax(logits.float(), dim=-1).cpu())
            labels.append(y.cpu())
        model.train(was_training)
        return torch.cat(log_probs), torch.cat(labels), []

    def evaluate(self, model: nn.Module, loader: Any, device: torch.device,
                 predict: Any = None) -> dict[str, Any]:
        """Return accuracy, per-class accuracy and mean NLL on the dev set."""
        lp, y, _ = self.collect_predictions(model, loader, device, predict)
        return classification_metrics(lp, y, num_classes=lp.shape[1])
