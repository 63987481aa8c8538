"""The generation path offline: a tiny random Llama + LoRA trained with DP, BLEU/ROUGE-L."""

from __future__ import annotations

import pytest
import torch

from dpbench.experiment import build_trainer
from tests.helpers.config import compose_config
from tests.helpers.synthetic import write_sst2

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick


def test_tiny_causal_lm_lora_trains_and_generates(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_sst2(tmp_path, n_train=40, n_dev=10)
    cfg = compose_config(
        "method=spectral_denoise", "dataset=sst2_gen", "model=causal_lm_lora",
        f"paths.data_root={tmp_path}", "dataset.train_size=32", "dataset.test_size=8",
        "dataset.max_source_length=12", "dataset.max_target_length=2", "trainer.batch_size=16",
        "trainer.epochs=1", "trainer.checkpoint=false", "privacy=sigma",
        "privacy.noise_multiplier=1.0", "privacy.accountant=rdp", "method.optimizer.lr=0.05")
    trainer = build_trainer(cfg, None)
    lora = {n: p.detach().clone() for n, p in trainer.model.named_parameters()
            if p.requires_grad}
    assert lora and all("lora_" in n for n in lora)  # only the adapters train
    result = trainer.fit()
    params = dict(trainer.model.named_parameters())
    assert all(not torch.equal(params[n], before) for n, before in lora.items())
    metrics = result["metrics"]
    assert 0 <= metrics["bleu"] <= 1 and 0 <= metrics["rougeL"] <= 1
    assert metrics["loss"] > 0 and metrics["perplexity"] > 1
    assert result["method_summary"]["denoised_matrices"] == 8  # A, B of q, v x 2 layers
