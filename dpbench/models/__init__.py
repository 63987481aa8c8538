"""Model registry: ``@register_model("name")`` builders take the data's shape and settings."""

from __future__ import annotations

from dpbench.registry import Registry

MODELS: Registry = Registry("model", entry_point_group="dpbench.models",
                            builtin_package=__name__, config_group="model",
                            framework_keys=("needs_data",))
register_model = MODELS.register
get_model_builder = MODELS.get
model_names = MODELS.names

__all__ = ["MODELS", "get_model_builder", "model_names", "register_model"]
