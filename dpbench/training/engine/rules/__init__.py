"""Book-keeping's layer rules, one module per layer type, and the lookup the engine uses.

Each module registers its rule with ``@layer_rule(<class or "module.qualname">)`` on
``LAYER_RULES`` (``base``); the modules are imported on the first lookup, so a new layer is one
new module here (and its test file): docs/engine.md, "Adding a layer".
"""

from __future__ import annotations

from torch import nn
from torch.nn.utils import parametrize

from dpbench.training.engine.rules.base import (
    LAYER_RULES,
    Call,
    Calls,
    LayerRule,
    layer_rule,
    qualified,
)

__all__ = ["LAYER_RULES", "Call", "Calls", "LayerRule", "layer_rule", "rule_class",
           "rule_for", "unsupported_reason"]


def rule_class(module: nn.Module) -> type | None:
    """Return the first class of ``module``'s MRO that has a rule, None if none."""
    for cls in type(module).__mro__:
        if qualified(cls) in LAYER_RULES:
            return cls
    return None


def rule_for(module: nn.Module) -> LayerRule | None:
    """Return the rule for ``module``, None if no rule computes its gradients exactly.

    A subclass of a rule's class gets the rule only if it keeps that class's ``forward`` and
    owns no trainable parameter besides the rule's (what the rule's equations cover: eq. 2 of
    Bu et al. for the layer's own computation, nothing else). A LoRA ``Linear`` with its own
    ``forward`` or a ``LayerNorm`` over another axis computes something else from the same
    recorded input and output gradient.
    """
    cls = rule_class(module)
    if cls is None or type(module).forward is not cls.forward:
        return None
    return LAYER_RULES.get(qualified(cls))


def unsupported_reason(module: nn.Module) -> str | None:
    """Return why book-keeping cannot handle ``module`` exactly, or None if it can: the
    checks every rule needs, then the rule's own (``LayerRule.check``)."""
    cls = rule_class(module)
    name = type(module).__name__
    if cls is None:
        return f"no book-keeping rule for {name}"
    if type(module).forward is not cls.forward:
        return f"{name} subclasses {cls.__name__} with its own forward"
    rule = LAYER_RULES.get(qualified(cls))
    extra = sorted(n for n, p in module.named_parameters(recurse=False)
                   if p.requires_grad and n not in rule.parameters)
    if extra:
        return f"{name} has trainable parameters {', '.join(extra)} no rule covers"
    if parametrize.is_parametrized(module):
        return f"{name} computes its weight (a parametrization)"
    for n in rule.parameters:
        value = getattr(module, n, None)
        if value is not None and not isinstance(value, nn.Parameter):
            return f"{name}.{n} is computed, not a parameter (e.g. old-style weight_norm)"
    if module._forward_pre_hooks:  # weight_norm, spectral_norm, pruning compute weights so
        return f"{name} has forward pre-hooks, which may compute its weight"
    return rule.check(module, cls)
