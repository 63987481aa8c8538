"""The pretrained fine-tuning backbones: DP-compatible, head-only option, clear offline error."""

from __future__ import annotations

import urllib.error

import pytest
import torch
from opacus.validators import ModuleValidator

from dpbench.errors import ConfigError
from dpbench.models.pretrained import pretrained


@pytest.mark.parametrize("arch", ["vit_small", "resnet18"])
def test_backbone_builds_offline_without_weights_and_is_dp_compatible(arch):
    pytest.importorskip("timm") if arch == "vit_small" else None
    model = pretrained((3, 32, 32), 100, arch=arch, weights=False, trainable="head",
                       resolution=32)
    assert ModuleValidator.validate(model, strict=False) == []
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 100)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".head." in n or ".fc." in n for n in trainable)


def test_missing_weights_offline_is_a_config_error(monkeypatch):
    def no_network(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_network)
    with pytest.raises(ConfigError, match="internet"):
        pretrained((3, 32, 32), 100, arch="resnet18", weights=True)


def test_bad_settings():
    with pytest.raises(ConfigError, match="arch"):
        pretrained((3, 32, 32), 100, arch="vit_huge")
    with pytest.raises(ConfigError, match="RGB"):
        pretrained((1, 28, 28), 10, arch="resnet18", weights=False)
