"""Method registry: ``register_method(DPMethod(...))`` plus the entry-point group
``dpbench.methods``.

Every module in this package is imported on first lookup, so a built-in method is one module
here (its mechanism, its update and the ``DPMethod`` record that names them), its settings
dataclass in ``dpbench/method_settings/<name>.py`` (torch-free: composing a config reads it)
and ``conf/method/<name>.yaml``. Outside packages register a ``DPMethod`` record through
the entry-point group (see docs/adding-a-method.md).
"""

from __future__ import annotations

from dpbench.methods.base import (
    DPMethod,
    EvalPoint,
    ExtraQuery,
    Halves,
    Mechanism,
    RunInfo,
    StepContext,
    Update,
)
from dpbench.registry import Registry


def check_method(name: str, method: object) -> None:
    """Refuse an entry that is not a ``DPMethod`` record, or one registered under a name other
    than its own (a method's name is spelled once, in its record)."""
    if not isinstance(method, DPMethod):
        raise TypeError(f"method {name!r}: a method is a DPMethod record (got "
                        f"{type(method).__name__})")
    if method.name != name:
        raise TypeError(f"method {name!r}: its record is named {method.name!r}")


METHODS: Registry[DPMethod] = Registry(
    "method", entry_point_group="dpbench.methods", builtin_package=__name__,
    check=check_method)
get_method = METHODS.get
method_names = METHODS.names


def register_method(method: DPMethod) -> DPMethod:
    """Register ``method`` under its own name (a duplicate name is refused); return it."""
    return METHODS.register(method.name)(method)


__all__ = ["DPMethod", "EvalPoint", "ExtraQuery", "Halves", "METHODS", "Mechanism", "RunInfo",
           "StepContext", "Update", "get_method", "method_names", "register_method"]
