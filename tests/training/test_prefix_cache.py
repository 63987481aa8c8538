"""Frozen-prefix caching: the same run, the same numbers, with the frozen bottom computed once."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from dpbench.config.schema import PrivacyConfig, TrainerConfig
from dpbench.data.base import TaskData
from dpbench.errors import ConfigError
from dpbench.hpo import evaluate_on_test
from dpbench.methods import get_method
from dpbench.models.transformer_lora import minilm_lora
from dpbench.tasks.text import TextClassification
from dpbench.training.loop import Trainer
from dpbench.training.prefix_cache import PrefixCachedModel, maybe_cache_prefix


def _data(n: int = 40, length: int = 10) -> TaskData:
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


def _run(cache: str, mode: str = "hooks", device: str = "cpu") -> tuple[Trainer, dict]:
    torch.manual_seed(0)
    model = minilm_lora((10,), 2, layers=[4, 5])
    data = _data()
    trainer = Trainer(method=get_method("dplora")(optimizer=torch.optim.Adam), model=model,
                      task=TextClassification(data), data=data,
                      privacy=PrivacyConfig(noise_multiplier=1.0, target_epsilon=None,
                                              accountant="rdp"),
                      trainer=TrainerConfig(epochs=2, batch_size=10, checkpoint=False,
                                            progress=False, device=device,
                                            grad_sample_mode=mode, cache_frozen_prefix=cache),
                      seed=3)
    return trainer, trainer.fit()


@pytest.mark.parametrize("mode", ["hooks", "ghost", "bk"])
def test_cached_run_equals_uncached_run(mode):
    torch.set_num_threads(1)
    cached, with_cache = _run("on", mode)
    plain, without = _run("off", mode)
    assert cached.data.train.tensors[0].dtype == torch.float32  # features, not token ids
    a = dict(cached.model.named_parameters())
    b = {f"model.{k}": v for k, v in plain.model.named_parameters()}
    trainable = [k for k, v in b.items() if v.requires_grad]
    assert len(trainable) > 2
    for name in trainable:
        key = next(k for k in a if k.endswith(name.removeprefix("model.")))
        torch.testing.assert_close(a[key], b[name], rtol=1e-6, atol=1e-6)
    assert with_cache["epsilon"] == without["epsilon"]
    assert with_cache["metrics"]["accuracy"] == without["metrics"]["accuracy"]


def test_cache_modes():
    model, data = minilm_lora((10,), 2, layers=[4, 5]), _data()
    cached, new = maybe_cache_prefix(model, data, torch.device("cpu"), "auto", 16)
    assert isinstance(cached, PrefixCachedModel) and len(new.train) == len(data.train)
    assert model.frozen_depth() == 4
    whole = minilm_lora((10,), 2)  # LoRA in every layer: nothing frozen below layer 0
    assert maybe_cache_prefix(whole, data, torch.device("cpu"), "auto", 16)[0] is whole
    with pytest.raises(ConfigError, match="trainer.cache_frozen_prefix=on"):
        maybe_cache_prefix(whole, data, torch.device("cpu"), "on", 16)
    with pytest.raises(ConfigError, match="trainer.cache_frozen_prefix must be"):
        maybe_cache_prefix(whole, data, torch.device("cpu"), "maybe", 16)


def test_hpo_scores_a_cached_model_on_the_raw_test_split():
    """dpbench.hpo's test evaluation of a trial trained on cached features equals the
    uncached run's evaluation: the raw test examples pass through the frozen prefix first."""
    torch.set_num_threads(1)
    cached, _ = _run("on")
    plain, without = _run("off")
    raw_test = _data().test
    assert isinstance(cached.model, PrefixCachedModel)
    scores = evaluate_on_test(cached, raw_test)
    assert scores["accuracy"] == without["metrics"]["accuracy"]
    assert scores["nll"] == pytest.approx(plain.evaluate()["nll"], rel=1e-5)
