"""Frozen-prefix caching: the same run, the same numbers, with the frozen bottom computed once."""

from __future__ import annotations

import pytest
import torch

from dpbench.errors import ConfigError
from dpbench.models.transformer_lora import minilm_lora
from dpbench.training.loop import Trainer
from dpbench.training.prefix_cache import PrefixCachedModel, maybe_cache_prefix
from tests.helpers.numerics import SAFETY, assert_matches_reference
from tests.helpers.text_runs import minilm_run, token_data

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

#: the longest inner product behind a LoRA gradient entry: MiniLM's hidden width
REDUCTION = 384


def _trained(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Return the trainable parameters by their name in the uncached model."""
    return {name.removeprefix("model."): p.detach() for name, p in
            trainer.model.named_parameters() if p.requires_grad}


def _test_margins(trainer: Trainer) -> torch.Tensor:
    """Return each test example's gap between the two largest logits."""
    ids, mask, _ = token_data().test.tensors
    with torch.no_grad():
        top2 = trainer.model(input_ids=ids, attention_mask=mask).topk(2, dim=1).values
    return top2[:, 0] - top2[:, 1]


@pytest.mark.parametrize("mode", ["hooks", "ghost", "bk"])
def test_cached_run_equals_uncached_run(mode):
    """Cached and uncached float32 runs both follow the float64 uncached run (the reference)
    within a bound that grows with the steps; their accuracies equal its accuracy, as no test
    example lies within rounding of the decision boundary."""
    torch.set_num_threads(1)
    cached, with_cache = minilm_run("on", mode)
    plain, without = minilm_run("off", mode)
    exact, reference = minilm_run("off", mode, dtype=torch.float64)
    assert cached.data.train.tensors[0].dtype == torch.float32  # features, not token ids
    assert isinstance(cached.model, PrefixCachedModel)
    ref = _trained(exact)
    assert len(ref) > 2 and all(p.dtype == torch.float64 for p in ref.values())
    steps = reference["steps"]
    for run, params in (("cached", _trained(cached)), ("uncached", _trained(plain))):
        assert params.keys() == ref.keys()
        for name, p in params.items():
            assert_matches_reference(p, ref[name],
                                     dtype=torch.float32, reduction=REDUCTION,
                                     safety=SAFETY * steps, name=f"{run} {name}")
    assert with_cache["epsilon"] == without["epsilon"] == reference["epsilon"]
    assert float(_test_margins(exact).min()) > 1e-3  # far above any rounding of the logits
    assert with_cache["metrics"]["accuracy"] == without["metrics"]["accuracy"] == \
        reference["metrics"]["accuracy"]


def test_cache_modes():
    model, data = minilm_lora((10,), 2, layers=[4, 5]), token_data()
    cached, new = maybe_cache_prefix(model, data, torch.device("cpu"), "auto", 16)
    assert isinstance(cached, PrefixCachedModel) and len(new.train) == len(data.train)
    assert model.frozen_depth() == 4
    whole = minilm_lora((10,), 2)  # LoRA in every layer: nothing frozen below layer 0
    assert maybe_cache_prefix(whole, data, torch.device("cpu"), "auto", 16)[0] is whole
    with pytest.raises(ConfigError, match="trainer.cache_frozen_prefix=on"):
        maybe_cache_prefix(whole, data, torch.device("cpu"), "on", 16)
    with pytest.raises(ConfigError, match="trainer.cache_frozen_prefix must be"):
        maybe_cache_prefix(whole, data, torch.device("cpu"), "maybe", 16)
