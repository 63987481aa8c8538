"""The layout of book-keeping's rules: one module per layer rule, each registered on the one
registry, each with its own test file here, none over 250 lines (docs/engine.md, "Adding a
layer")."""

from __future__ import annotations

import pkgutil
from pathlib import Path

import pytest
from torch import nn

from dpbench.training.engine import rules
from dpbench.training.engine.rules import LAYER_RULES, LayerRule, layer_rule, unsupported_reason

TESTS = Path(__file__).resolve().parent
MAX_LINES = 250


def _rule_modules() -> list[str]:
    return [m.name for m in pkgutil.iter_modules(rules.__path__) if m.name != "base"]


def test_every_rule_module_has_its_test_file_and_stays_small():
    modules = _rule_modules()
    assert {"linear", "conv", "conv1d", "embedding", "norm", "std_conv", "layer_scale",
            "sequence_bias", "vit"} <= set(modules)
    for name in modules:
        assert (TESTS / f"test_{name}.py").is_file(), f"rules/{name}.py has no test_{name}.py"
    for path in Path(rules.__file__).parent.glob("*.py"):
        lines = len(path.read_text().splitlines())
        assert lines <= MAX_LINES, f"{path.name} has {lines} lines (at most {MAX_LINES})"


def test_every_registered_rule_comes_from_its_own_module():
    names = LAYER_RULES.names()
    assert "torch.nn.modules.linear.Linear" in names
    assert "timm.models.vision_transformer.VisionTransformer" in names
    homes = {type(LAYER_RULES.get(n)).__module__.rsplit(".", 1)[1] for n in names}
    assert homes == set(_rule_modules())


def test_a_second_rule_for_a_class_is_refused():
    class Another(LayerRule):
        pass

    LAYER_RULES.load_plugins()  # the built-in rules first, in any test order
    with pytest.raises(ValueError, match="already registered"):
        layer_rule(nn.Linear)(Another)


def test_a_layer_without_a_rule_is_named():
    assert unsupported_reason(nn.Conv3d(1, 1, 1)) == "no book-keeping rule for Conv3d"
