"""``auto`` runs book-keeping on the model of every preset in ``conf/experiment/``.

Each preset is composed as the CLI composes it and built by ``build_trainer`` (so the engine
is chosen and passes the per-run check exactly as a run's would), with only what a clean
clone offline cannot have replaced, never the model's layers:

* data: synthetic files in each loader's real format under ``paths.data_root``
  (``tests/helpers/synthetic.py``; E2E through a stand-in for Hugging Face ``datasets``),
  training subsets off (the files are small), batch sizes capped at 16 (and the adaptive
  threshold's count noise ``sigma_b`` raised, which the smaller data set otherwise pushes
  below the gradient's sigma / 2);
* ``model=pretrained``: ``model.weights=false`` (timm's ViT-small layout, random init) at a
  CPU resolution of 32 (the same layers; the position embedding has 5 rows, not 197);
* the hub models of the GPU presets (RoBERTa-base for ``spectral_sst2_roberta``,
  Qwen2.5-0.5B for ``spectral_e2e``) cannot be downloaded here: each is replaced by a local
  folder holding the same architecture class (``RobertaForSequenceClassification``,
  ``Qwen2ForCausalLM`` with tied embeddings) at a tiny width with random weights and the
  packaged MiniLM tokenizer, built by the preset's own builder, LoRA targets and head.

The assertion: ``grad_sample_mode`` is ``bk`` and no engine was tried and rejected first.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict

from dpbench.experiment import build_trainer
from tests.helpers import synthetic
from tests.helpers.config import REPO, compose_config

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

PRESETS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))
BATCH_CAP = 16


class _FakeDatasets:
    """Stands in for Hugging Face ``datasets`` (E2E rows in the hub's schema)."""

    @staticmethod
    def load_dataset(name, config=None, split=None):
        return synthetic.e2e_rows(40 if split == "train" else 8)


def _write_cifar100(folder: Path) -> None:
    import pickle

    import numpy as np

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 40), ("test", 10)):
        batch = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 "fine_labels": rng.integers(0, 100, n).tolist(),
                 "coarse_labels": rng.integers(0, 20, n).tolist()}
        (folder / split).write_bytes(pickle.dumps(batch, protocol=2))
    names = [f"class{i}" for i in range(100)]
    (folder / "meta").write_bytes(pickle.dumps({"fine_label_names": names}, protocol=2))


@pytest.fixture(scope="session")  # once per worker, whatever runs between its users
def data_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("preset-data")
    synthetic.write_mnist_copy(root, n=200)
    synthetic.write_fashion_csv(root, n=100)
    synthetic.write_cifar10_jpegs(root, per_class=4)
    _write_cifar100(root / "cifar-100-python")
    synthetic.write_dutch(root, n=200)
    synthetic.write_ett(root, "etth1")
    synthetic.write_ett(root, "ettm1")
    synthetic.write_sst2(root, n_train=60, n_dev=20)
    return root


@pytest.fixture(scope="session")  # once per worker, whatever runs between its users
def hub_stand_ins(tmp_path_factory) -> dict[str, Path]:
    """Return {model name: local folder} of tiny random models of the hub architectures."""
    from transformers import (
        Qwen2Config,
        Qwen2ForCausalLM,
        RobertaConfig,
        RobertaForSequenceClassification,
    )

    from dpbench.utils.pretrained import OFFLINE_DEFAULT, load_tokenizer

    tokenizer = load_tokenizer(OFFLINE_DEFAULT)
    out = {}
    roberta = RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=64,
                            max_position_embeddings=160, pad_token_id=tokenizer.pad_token_id,
                            num_labels=2)
    qwen = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                       num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                       max_position_embeddings=256, tie_word_embeddings=True,
                       pad_token_id=tokenizer.pad_token_id)
    for name, model in (("roberta_lora", RobertaForSequenceClassification(roberta)),
                        ("causal_lm_lora", Qwen2ForCausalLM(qwen))):
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        out[name] = folder
    return out


def _preset_config(name: str, data_root: Path, hub: dict[str, Path]):
    cfg = compose_config(f"experiment={name}", f"paths.data_root={data_root}")
    with open_dict(cfg):
        for key in ("train_subset", "train_size", "test_size", "max_train_windows",
                    "max_test_windows"):
            if key in cfg.dataset:
                cfg.dataset[key] = None
        if "download" in cfg.dataset:
            cfg.dataset.download = False
        settings = cfg.method.get("settings") or {}
        if "sigma_b" in settings:  # tiny data at the preset's epsilon: a large sigma the
            cfg.method.settings.sigma_b = 100.0  # count query must stay below 2 sigma_b
        if cfg.model.name == "pretrained":
            cfg.model.weights = False
            cfg.model.resolution = 32
        if cfg.model.name in hub and cfg.model.get("pretrained") not in ("minilm",
                                                                         "tiny-random"):
            cfg.model.pretrained = str(hub[cfg.model.name])
        cfg.trainer.batch_size = min(int(cfg.trainer.batch_size), BATCH_CAP)
        cfg.trainer.max_physical_batch_size = None
        cfg.trainer.eval_batch_size = BATCH_CAP
    OmegaConf.resolve(cfg)
    return cfg


@pytest.mark.parametrize("preset", PRESETS)
def test_auto_runs_bk_on_every_preset_model(preset, data_root, hub_stand_ins, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", _FakeDatasets())
    cfg = _preset_config(preset, data_root, hub_stand_ins)
    assert cfg.trainer.grad_sample_mode == "auto"
    trainer = build_trainer(cfg, None)
    assert trainer.grad_sample_mode == "bk", (preset, trainer.engine_rejected)
    assert trainer.engine_rejected == [], trainer.engine_rejected
    assert trainer.engine_checks[0]["engine"] == "bk"
    if trainer.method.gradient_evaluations_per_step() > 1:  # DiSK, FIBER: two points
        assert trainer.engine.combines_points
