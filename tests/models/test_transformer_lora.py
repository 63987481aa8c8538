"""MiniLM + LoRA under Opacus: end-to-end offline training, exact per-example grads, ghost."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from transformers import AutoConfig

from dpbench.errors import ConfigError, DataError
from dpbench.experiment import build_trainer
from dpbench.models.transformer_lora import minilm_lora
from dpbench.training.engine.choice import build_engine
from dpbench.utils.pretrained import from_pretrained
from tests.helpers.config import compose_config
from tests.helpers.engines import ONE_POINT
from tests.helpers.method_steps import info
from tests.helpers.numerics import assert_matches_reference, float64_copy, one_at_a_time_grads
from tests.helpers.synthetic import write_sst2

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

TINY = ["dataset=sst2", "model=minilm_lora", "dataset.train_size=48", "dataset.test_size=16",
        "dataset.max_length=12", "trainer.batch_size=16", "trainer.epochs=1",
        "trainer.checkpoint=false", "privacy=sigma", "privacy.noise_multiplier=1.0",
        "privacy.accountant=rdp"]
#: the longest sum behind a gradient entry: the hidden width of MiniLM
REDUCTION = 384


def _no_dropout(model: torch.nn.Module) -> torch.nn.Module:
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def test_hub_model_offline_is_a_clear_data_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="(?s)not available offline.*model.pretrained=minilm"):
        from_pretrained(AutoConfig, "roberta-base")


def test_lora_model_trains_end_to_end_offline(tmp_path, monkeypatch):
    """One DP epoch of spectral_denoise: LoRA factors and head change, the encoder does not."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_sst2(tmp_path, n_train=60, n_dev=20)
    cfg = compose_config("method=spectral_denoise", f"paths.data_root={tmp_path}",
                         "trainer.eval_every_steps=1", *TINY)
    trainer = build_trainer(cfg, None)
    names = dict(trainer.model.named_parameters())
    before = {n: p.detach().clone() for n, p in names.items()}
    trainable = {n for n, p in names.items() if p.requires_grad}
    assert sum("lora_" in n for n in trainable) == 24  # A and B of query, value x 6 layers
    result = trainer.fit()
    changed = {n for n, p in names.items() if not torch.equal(p, before[n])}
    assert changed == trainable  # every LoRA factor and the head moved (Opacus issue #820)
    assert result["steps"] == 3 and len(result["step_history"]) == 3
    assert 0.0 <= result["metrics"]["accuracy"] <= 1.0
    assert 0 < result["epsilon"] < float("inf")
    assert result["method_summary"]["denoised_matrices"] == 24


def test_lora_per_example_gradients_exact_and_ghost_matches(tmp_path):
    """Opacus's per-example LoRA grads equal one-by-one autograd; ghost gives the same sum."""
    from dpbench.data.text import build_glue
    from dpbench.tasks.text import TextClassification

    write_sst2(tmp_path, n_train=10, n_dev=4)
    data = build_glue("sst2", root=tmp_path, max_length=12, train_size=3, test_size=1)
    batch = data.train.tensors
    task = TextClassification(data)
    torch.manual_seed(0)
    model = _no_dropout(minilm_lora((12,), 2)).train()
    reference = float64_copy(model)  # the float64 one-at-a-time reference
    ghost_model = copy.deepcopy(model)
    engine = build_engine(model, "hooks")
    grads, _ = engine.per_example(task.per_example_loss, batch)
    expected = one_at_a_time_grads(
        reference, lambda m, i: task.per_example_loss(m, tuple(t[i:i + 1] for t in batch)).sum(),
        3)
    for j, g in enumerate(grads):
        assert_matches_reference(g, torch.stack([e[j] for e in expected]), dtype=torch.float32,
                                 reduction=REDUCTION, per_row=True, name=f"parameter {j}")
    ghost = build_engine(ghost_model, "ghost")
    factors = lambda norms: (0.5 / norms).clamp(max=1.0)  # noqa: E731
    sums, norms, *_ = ghost.clipped_sum(task.per_example_loss, batch, ONE_POINT, factors)
    flat = torch.stack([torch.cat([g.flatten() for g in e]).norm() for e in expected])
    assert_matches_reference(norms, flat, reduction=REDUCTION, name="ghost norms")
    for j, s in enumerate(sums):
        clipped = sum(factors(flat)[i] * expected[i][j] for i in range(3))
        assert_matches_reference(s, clipped, dtype=torch.float32, reduction=REDUCTION,
                                 name=f"ghost sum {j}")


def test_linear_adapter_trains_target_weights_directly():
    """adapter=linear: the query/value weights and the head train; spectral all_2d selects them."""
    from dpbench.methods.spectral_denoise import SPECTRAL_DENOISE

    model = minilm_lora((12,), 2, adapter="linear")
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert len(trainable) == 6 * 2 + 2 and not any("lora_" in n for n in trainable)
    assert all(n.endswith(("query.weight", "value.weight")) or n.startswith("head.")
               for n in trainable)
    update = SPECTRAL_DENOISE.configured(targets="all_2d").halves().update
    names = tuple(n for n, p in model.named_parameters() if p.requires_grad)
    update.setup([p for p in model.parameters() if p.requires_grad],
                 dataclasses.replace(info(), param_names=names))
    assert len(update.selected) == 13  # 12 weights 384 x 384 and the 2 x 384 head


def test_bad_model_settings_raise():
    with pytest.raises(ConfigError, match="adapter"):
        minilm_lora((12,), 2, adapter="prefix")
    with pytest.raises(ConfigError, match="target_modules"):
        minilm_lora((12,), 2, target_modules=["no_such_layer"])
