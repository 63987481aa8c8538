"""Method registry: ``@register_method("name")`` plus the entry-point group ``dpbench.methods``.

Every module in this package is imported on first lookup, so a built-in method is one module
here (its mechanism, its update and the ``DPMethod`` that pairs them) plus
``conf/method/<name>.yaml``. Outside packages register through the entry-point group (see
docs/adding-a-method.md).
"""

from __future__ import annotations

from dpbench.methods.base import (
    DPMethod,
    EvalPoint,
    ExtraQuery,
    Mechanism,
    RunInfo,
    StepContext,
    Update,
)
from dpbench.registry import Registry

METHODS: Registry[type[DPMethod]] = Registry(
    "method", entry_point_group="dpbench.methods", builtin_package=__name__
)
register_method = METHODS.register
get_method = METHODS.get
method_names = METHODS.names

__all__ = ["DPMethod", "EvalPoint", "ExtraQuery", "METHODS", "Mechanism", "RunInfo",
           "StepContext", "Update", "get_method", "method_names", "register_method"]
