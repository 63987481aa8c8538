"""Every config group option composes, and the schemas reject bad values at validation."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dpbench.config.schema import PrivacyConfig, TrainerConfig
from dpbench.errors import ConfigError
from dpbench.utils.conf import CONF_DIR
from tests.helpers.config import compose_config

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


@pytest.mark.parametrize("kwargs,key", [
    ({"noise_multiplier": 0.5, "target_epsilon": 1.0}, "privacy.noise_multiplier"),
    ({"enabled": False, "target_epsilon": 3.0}, "privacy.enabled=false"),
    ({"enabled": False, "target_epsilon": None, "delta": 1e-6}, "privacy.delta=1e-06"),
    ({"clip_norm": float("inf")}, "privacy.clip_norm must be finite"),
])
def test_privacy_schema_refuses_settings_it_would_ignore(kwargs, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        PrivacyConfig(**kwargs)


@pytest.mark.parametrize("option", _options("privacy"))
def test_every_privacy_option_is_valid_as_shipped(option):
    cfg = compose_config(f"privacy={option}")
    privacy = PrivacyConfig(**OmegaConf.to_container(cfg.privacy, resolve=True))
    assert privacy.name.startswith(option)  # sigma's name carries its value: sigma1.0
    if option.startswith("eps"):  # epsN targets epsilon N
        assert privacy.target_epsilon == float(option.removeprefix("eps"))


def test_the_privacy_options_are_found_on_disk():
    assert {"sigma", "nonprivate", "eps1", "eps2", "eps3", "eps4", "eps8"} <= set(
        _options("privacy"))


def test_a_private_method_may_run_without_privacy_but_not_the_reverse():
    from dpbench.config.schema import check_privacy_matches_method

    off = PrivacyConfig(name="nonprivate", enabled=False, target_epsilon=None)
    check_privacy_matches_method("dpsgd", True, off)  # a non-private ablation of DP-SGD
    check_privacy_matches_method("dpsgd", True, PrivacyConfig())
    check_privacy_matches_method("ivon", False, off)
    with pytest.raises(ConfigError, match="method ivon is non-private; use privacy=nonprivate"):
        check_privacy_matches_method("ivon", False, PrivacyConfig())


@pytest.mark.parametrize("seed", ["abc", -1, 1.5, True, 2**63, None])
def test_check_seed_names_seed(seed):
    from dpbench.config.schema import check_seed

    with pytest.raises(ConfigError, match=r"^seed must be an integer"):
        check_seed(seed)


def test_check_dataset_and_method_numbers():
    from dpbench.config.schema import check_dataset, check_method_numbers

    check_dataset({"train_fraction": 0.8, "train_subset": None, "max_train_windows": 5})
    for bad, key in [({"train_fraction": 1.0}, "dataset.train_fraction"),
                     ({"train_subset": 0}, "dataset.train_subset"),
                     ({"test_size": -1}, "dataset.test_size")]:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            check_dataset(bad)
    check_method_numbers({"lr": 0.1, "betas": [0.9, 0.999], "_partial_": True}, {"k": None})
    with pytest.raises(ConfigError, match=r"method\.optimizer\.betas\[1\] must be a finite"):
        check_method_numbers({"lr": 0.1, "betas": [0.9, float("inf")]}, {})
    with pytest.raises(ConfigError, match=r"method\.optimizer\.lr must be a finite number > 0"):
        check_method_numbers({"lr": -0.1}, {})


def test_trainer_schema_checks_eval_every_and_cuda(monkeypatch):
    import torch

    with pytest.raises(ConfigError, match=r"trainer\.eval_every must be an integer >= 1"):
        TrainerConfig(eval_every=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    TrainerConfig(device="cuda:0")
    with pytest.raises(ConfigError, match=r"trainer\.device=cuda:1: this machine has 1 CUDA"):
        TrainerConfig(device="cuda:1")
