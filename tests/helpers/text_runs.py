"""A tiny DP-LoRA run of the packaged MiniLM on synthetic token ids (frozen-prefix cache on/off)."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from dpbench.config.schema import PrivacyConfig, TrainerConfig
from dpbench.data.base import TaskData
from dpbench.methods import get_method
from dpbench.models.transformer_lora import minilm_lora
from dpbench.tasks.text import TextClassification
from dpbench.training.loop import Trainer


def token_data(n: int = 40, length: int = 10) -> TaskData:
    """Token ids of the real tokenizer's vocabulary with varied padding, and labels."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 5000, (n, length), generator=gen)
    mask = torch.ones(n, length, dtype=torch.long)
    for i in range(n):
        mask[i, 4 + i % (length - 4):] = 0
    ids = ids * mask
    labels = torch.randint(0, 2, (n,), generator=gen)
    cut = 3 * n // 4
    return TaskData(name="tokens", task="text_classification",
                    train=TensorDataset(ids[:cut], mask[:cut], labels[:cut]),
                    test=TensorDataset(ids[cut:], mask[cut:], labels[cut:]), num_classes=2,
                    input_shape=(length,))


def minilm_run(cache: str, mode: str = "hooks", device: str = "cpu",
         dtype: torch.dtype = torch.float32) -> tuple[Trainer, dict]:
    torch.manual_seed(0)
    model = minilm_lora((10,), 2, layers=[4, 5]).to(dtype)
    data = token_data()
    trainer = Trainer(method=get_method("dplora").configured(optimizer=torch.optim.Adam),
                      model=model,
                      task=TextClassification(data), data=data,
                      privacy=PrivacyConfig(noise_multiplier=1.0, target_epsilon=None,
                                              accountant="rdp"),
                      trainer=TrainerConfig(epochs=2, batch_size=10, checkpoint=False,
                                            progress=False, device=device,
                                            grad_sample_mode=mode, cache_frozen_prefix=cache),
                      seed=3)
    return trainer, trainer.fit()
