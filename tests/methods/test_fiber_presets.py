"""The FIBER presets compose with every compared method and say what they run."""

from __future__ import annotations

import pytest

from tests.helpers.config import compose_config

PRESETS = {"fiber_mnist_cpu": ("mnist", "cnn2"), "fiber_mnist": ("mnist", "cnn2"),
           "fiber_fashion_mnist": ("fashion_mnist", "cnn2"),
           "fiber_cifar10": ("cifar10", "resnet18"), "fiber_cifar10_cpu": ("cifar10", "cnn2"),
           "fiber_cifar100_vit": ("cifar100", "pretrained")}


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("method", ["dpadamw", "disk", "dpadam_bc", "fiber", "bandmf"])
def test_preset_composes(preset, method):
    cfg = compose_config(f"experiment={preset}", f"method={method}", "privacy=eps2")
    assert (cfg.dataset.name, cfg.model.name) == PRESETS[preset]
    assert cfg.method.name == method and cfg.privacy.target_epsilon == 2.0


def test_cpu_preset_is_small():
    cfg = compose_config("experiment=fiber_mnist_cpu", "method=fiber")
    assert cfg.trainer.device == "cpu" and cfg.trainer.epochs * 8000 / cfg.trainer.batch_size < 100
