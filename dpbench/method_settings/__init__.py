"""Each built-in method's ``method.settings`` dataclass, by method name, without torch.

Composing a config (``dpbench --help``, ``--cfg job``, a sweep's checks) needs every method's
settings schema but none of its training code, so the frozen dataclasses live here, one
module per method as in ``dpbench/methods/`` and ``conf/method/`` (``dpsgd.py`` <->
``dpbench/methods/dpsgd.py`` <-> ``conf/method/dpsgd.yaml``), and import nothing that trains.
Each module registers its method's defaults (an instance of the dataclass, ``NoSettings()``
for a method without settings) with ``register_settings``; a name registered twice is
refused. The method's ``DPMethod`` record holds the same dataclass
(``tests/methods/test_settings.py`` checks both registries name the same methods and classes).
Outside packages' methods carry their settings in their own record (``method=plugin``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from dpbench.method_settings.base import NoSettings, checked_settings, is_number, require
from dpbench.registry import Registry

T = TypeVar("T", bound=type)


def check_defaults(name: str, defaults: object) -> None:
    """Refuse an entry that is not an instance of a frozen dataclass."""
    if not dataclasses.is_dataclass(defaults) or isinstance(defaults, type) \
            or not type(defaults).__dataclass_params__.frozen:
        raise TypeError(f"method {name!r}: its settings must be an instance of a frozen "
                        f"dataclass (got {defaults!r})")


#: method name -> the defaults of its ``method.settings`` (an instance of its dataclass)
SETTINGS: Registry[Any] = Registry("method settings", builtin_package=__name__,
                                   check=check_defaults)


def register_settings(name: str) -> Callable[[T], T]:
    """Return a class decorator registering the class's defaults as method ``name``'s
    settings (a second registration of ``name`` is refused)."""

    def decorator(cls: T) -> T:
        SETTINGS.register(name)(cls())
        return cls

    return decorator


def settings_class(name: str) -> type:
    """Return the dataclass of built-in method ``name``'s settings."""
    return type(SETTINGS.get(name))


__all__ = ["NoSettings", "SETTINGS", "checked_settings", "is_number", "register_settings",
           "require", "settings_class"]
