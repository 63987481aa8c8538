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
    check_pair,
)
from dpbench.registry import Registry


def check_method(cls: type) -> None:
    """Refuse a method class (or any class it inherits from) that defines a hook outside its
    mechanism and update (``check_pair``): hooks set on the class after it was created too."""
    for klass in cls.__mro__:
        if klass not in (DPMethod, object):
            check_pair(klass)


METHODS: Registry[type[DPMethod]] = Registry(
    "method", entry_point_group="dpbench.methods", builtin_package=__name__,
    check=check_method)
register_method = METHODS.register
get_method = METHODS.get
method_names = METHODS.names

__all__ = ["DPMethod", "EvalPoint", "ExtraQuery", "METHODS", "Mechanism", "RunInfo",
           "StepContext", "Update", "get_method", "method_names", "register_method"]
