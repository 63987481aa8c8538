"""Text generation: per-example mean token NLL of the target; BLEU and ROUGE-L of greedy text."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dpbench.tasks import register_task
from dpbench.tasks.base import Task
from dpbench.utils.tensors import move_to


def target_nll(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Return per example the mean NLL of the next-token predictions over labelled tokens."""
    logits, labels = logits[:, :-1], labels[:, 1:]
    nll = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
    count = (labels != -100).sum(dim=1).clamp(min=1)
    return nll.sum(dim=1) / count


@register_task("text_generation")
class TextGeneration(Task):
    """Batches (input_ids, attention_mask, labels); ``generate_examples`` test prompts decoded."""

    def per_example_loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        input_ids, attention_mask, labels = batch[0], batch[1], batch[2]
        return target_nll(model(input_ids=input_ids, attention_mask=attention_mask), labels)

    def primary_metric(self) -> tuple[str, str]:
        return "bleu", "max"

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader: Any, device: torch.device,
                 predict: Any = None) -> dict[str, Any]:
        """Return test NLL and perplexity, and BLEU / ROUGE-L of greedy decoding."""
        from torchmetrics.text import BLEUScore, ROUGEScore

        was_training = model.training
        model.eval()
        losses = []
        for batch in loader:
            batch = move_to(batch, device)
            losses.append(self.per_example_loss(model, batch).float().cpu())
        loss = float(torch.cat(losses).mean())
        gen = self.data.extras["generation"]
        k = int(self.settings.get("generate_examples", 32))
        ids, mask = gen["prompt_ids"][:k].to(device), gen["prompt_mask"][:k].to(device)
        hyps = [h.strip() for h in gen["decode"](model.generate(ids, mask,
                                                                gen["max_new_tokens"]))]
        refs = gen["references"][:k]
        model.train(was_training)
        rouge = ROUGEScore(rouge_keys=("rougeL",))(hyps, [r[0] for r in refs])
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)),
                "bleu": float(BLEUScore()(hyps, refs)),
                "rougeL": float(rouge["rougeL_fmeasure"]),
                "exact_match": sum(h == r[0] for h, r in zip(hyps, refs)) / max(len(refs), 1)}
