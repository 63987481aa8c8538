"""Every config group option composes, and the schemas reject bad values at validation."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dpbench.cli import CONF_DIR
from dpbench.config.schema import PrivacyConfig, TrainerConfig
from dpbench.errors import ConfigError
from tests.conftest import compose_config

GROUPS = ["method", "dataset", "model", "privacy", "trainer", "logger", "experiment"]


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in _options(g)])
def test_every_group_option_composes(group, option):
    overrides = [f"{group}={option}"]
    if group == "method" and option == "plugin":
        overrides.append("method.name=dpsgd")
    cfg = compose_config(*overrides)
    OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
    if group != "experiment":
        assert cfg.get(group) is not None


def test_method_dataset_overlay_is_applied():
    cfg = compose_config("method=dpsgd", "dataset=mnist")
    assert cfg.method.optimizer.lr == 2.0  # conf/method_dataset/dpsgd_mnist.yaml


@pytest.mark.parametrize("kwargs,key", [
    ({"target_epsilon": 0.0}, "privacy.target_epsilon"),
    ({"target_epsilon": -1.0}, "privacy.target_epsilon"),
    ({"target_epsilon": float("nan")}, "privacy.target_epsilon"),
    ({"clip_norm": 0.0}, "privacy.clip_norm"),
    ({"delta": 1.5}, "privacy.delta"),
    ({"accountant": "moments"}, "privacy.accountant"),
    ({"noise_multiplier": -1.0}, "privacy.noise_multiplier"),
])
def test_privacy_schema_rejects(kwargs, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        PrivacyConfig(**kwargs)


@pytest.mark.parametrize("kwargs,key", [
    ({"epochs": 0}, "trainer.epochs"), ({"batch_size": 0}, "trainer.batch_size"),
    ({"grad_sample_mode": "magic"}, "trainer.grad_sample_mode"),
    ({"nonfinite": "ignore"}, "trainer.nonfinite"), ({"device": "tpu"}, "trainer.device"),
])
def test_trainer_schema_rejects(kwargs, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        TrainerConfig(**kwargs)


def test_type_errors_fail_at_composition():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        compose_config("privacy.target_epsilon=abc")
