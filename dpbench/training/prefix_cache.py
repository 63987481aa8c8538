"""Frozen-prefix caching: train on the outputs of a model's frozen bottom, computed once.

When every layer below the first trainable parameter is frozen and deterministic (a model
that offers ``prefix_features`` / ``forward_from_prefix``, such as LoRA on the top layers of
MiniLM), each example's features at that depth are a fixed function of the example alone.
They are computed once per example; training and evaluation then run only the layers above.
The per-example gradients are those of the uncached model, so clipping, noise and the
accounting are unchanged (docs/engine.md, "Frozen-prefix caching").
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from dpbench.data.base import TaskData
from dpbench.errors import ConfigError

log = logging.getLogger(__name__)
MODES = ("auto", "on", "off")


class PrefixCachedModel(nn.Module):
    """The trainable top of ``model``, fed with cached prefix features.

    Tasks call it as they call the model (``input_ids=..., attention_mask=...``); here the
    first argument holds the cached hidden states.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model.forward_from_prefix(input_ids, attention_mask)


def supports_prefix_cache(model: nn.Module) -> bool:
    """Return whether ``model`` has a frozen, deterministic prefix of depth >= 1 to cache."""
    depth = getattr(model, "frozen_depth", None)
    return callable(depth) and hasattr(model, "prefix_features") and depth() > 0


def cache_features(model: nn.Module, dataset: Dataset, device: torch.device,
                   batch_size: int) -> TensorDataset:
    """Return (features, attention_mask, label) for every example of ``dataset``, in order."""
    feats, masks, labels = [], [], []
    model.eval()
    # its own generator: iterating a DataLoader draws a seed, which must not move the global
    # RNG that dropout in the trainable layers uses (the cached run must equal the uncached)
    loader = DataLoader(dataset, batch_size=batch_size, generator=torch.Generator())
    for input_ids, attention_mask, label in loader:
        feats.append(model.prefix_features(input_ids.to(device),
                                           attention_mask.to(device)).cpu())
        masks.append(attention_mask)
        labels.append(label)
    return TensorDataset(torch.cat(feats), torch.cat(masks), torch.cat(labels))


def maybe_cache_prefix(model: nn.Module, data: TaskData, device: torch.device, mode: str,
                       batch_size: int) -> tuple[nn.Module, TaskData]:
    """Return (model, data) with the frozen prefix cached when ``mode`` allows and it applies."""
    if mode not in MODES:
        raise ConfigError(f"trainer.cache_frozen_prefix must be one of {', '.join(MODES)} "
                          f"(got {mode!r})")
    if mode == "off" or (mode == "auto" and not supports_prefix_cache(model)):
        return model, data
    if not supports_prefix_cache(model):
        raise ConfigError(f"trainer.cache_frozen_prefix=on: model {type(model).__name__} has "
                          "no frozen prefix to cache (use auto or off)")
    if data.task != "text_classification":
        if mode == "on":
            raise ConfigError("trainer.cache_frozen_prefix=on supports text_classification "
                              f"data (got {data.task!r})")
        return model, data
    model = model.to(device)
    train = cache_features(model, data.train, device, batch_size)
    test = cache_features(model, data.test, device, batch_size)
    log.info("frozen prefix cached: %d layers below the first trainable one, %d + %d "
             "examples", model.frozen_depth(), len(train), len(test))
    return PrefixCachedModel(model), replace(data, train=train, test=test)
