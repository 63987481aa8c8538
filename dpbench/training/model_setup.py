"""The model a run trains: the method's stage 0, the frozen-prefix cache, the DP checks.

``prepare_model`` reconfigures the model for the method (bounded AdaLN modulation, LoRA),
replaces a frozen prefix by its cached features where asked (``prefix_cache``), refuses a
model Opacus's validator rejects under DP (BatchNorm: use GroupNorm), and moves it to the
run's device before any engine hooks it (peft and Opacus need that order).
"""

from __future__ import annotations

from typing import Any

import torch
from opacus.validators import ModuleValidator
from torch import nn

from dpbench.data.base import TaskData
from dpbench.errors import ConfigError
from dpbench.methods.base import DPMethod
from dpbench.training.prefix_cache import maybe_cache_prefix
from dpbench.utils.seeding import seed_everything


def prepare_model(method: DPMethod, model: nn.Module, data: TaskData, device: torch.device,
                  trainer: Any, private: bool, seed: int) -> tuple[nn.Module, TaskData]:
    """Return (the model on ``device``, the data it trains on); refuse what cannot run."""
    if method.tasks is not None and data.task not in method.tasks:
        raise ConfigError(f"method {method.name!r} does not support the {data.task!r} task "
                          f"of dataset {data.name!r} (it supports: "
                          f"{', '.join(sorted(method.tasks))})")
    seed_everything(seed, "model_configure")
    if method.configure_model is not None:  # stage 0: model-side methods
        model = method.configure_model(model, method.settings)
    model, data = maybe_cache_prefix(model, data, device, trainer.cache_frozen_prefix,
                                     trainer.eval_batch_size)
    if private:
        errors = ModuleValidator.validate(model, strict=False)
        if errors:
            raise ConfigError("model is not DP-compatible (Opacus ModuleValidator): "
                              + "; ".join(str(e) for e in errors)
                              + ". Use GroupNorm instead of BatchNorm.")
    return model.to(device), data
