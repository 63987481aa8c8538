"""dp_adaln / dp_vanilla switch the model's bounds; other models are refused before training."""

from __future__ import annotations

import pytest
from torch import nn

from dpbench.errors import ConfigError
from dpbench.methods import get_method
from dpbench.models.dit import Bounds, TimeSeriesDiT


def test_methods_switch_bounds_and_override_them():
    model = TimeSeriesDiT(2, 5, hidden=8, depth=1, heads=2, bounds=Bounds(False, c_max=3.0))
    bounded = get_method("dp_adaln").configured(c_max=0.5, m_alpha=0.1)
    bounded.configure_model(model, bounded.settings)
    assert model.bounds.enabled and model.bounds.c_max == 0.5 and model.bounds.m_alpha == 0.1
    assert model.blocks[0].bounds is model.bounds  # one shared object
    get_method("dp_vanilla").configure_model(model, None)
    assert not model.bounds.enabled


def test_bad_settings_and_models_are_config_errors():
    with pytest.raises(ConfigError):
        get_method("dp_adaln").configured(c_max=-1.0)
    with pytest.raises(ConfigError):
        method = get_method("dp_adaln")
        method.configure_model(nn.Linear(2, 2), method.settings)
    with pytest.raises(ConfigError):
        get_method("dp_adaln").configured(clip=1.0).halves()
