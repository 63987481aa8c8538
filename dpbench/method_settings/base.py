"""``method.settings``: what every method's settings dataclass shares (torch-free).

Each built-in method's frozen dataclass lives in ``dpbench.method_settings.<name>`` (the
keys, their types and defaults; one source). A method's record (``DPMethod``) holds an
instance of it as ``settings``: the defaults when registered, the run's checked values once
configured, read as attributes by both halves (``settings.kappa``).
``dpbench.config.schema.register_schemas``
stores it in Hydra's ConfigStore as ``method/settings/<name>``, which the method's YAML lists
first in its defaults (``- settings: <name>``). Hydra then checks types when it composes (a
string for a float fails there, naming the key), and the YAML states only what differs from
the defaults. Range checks live in the dataclass's ``__post_init__`` and run when the method is
built, before any data is loaded or privacy spent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dpbench.errors import ConfigError
from dpbench.utils import ranges
from dpbench.utils.ranges import is_number

__all__ = ["NoSettings", "checked_settings", "is_number", "require"]


@dataclasses.dataclass(frozen=True)
class NoSettings:
    """The settings of a method that has none."""


def require(ok: bool, key: str, expected: str, value: Any) -> None:
    """Raise ConfigError ``method.settings.<key> must be <expected> (got <value>)`` unless ok
    (``dpbench.utils.ranges``, the one place range checks and their messages live)."""
    ranges.require(ok, f"method.settings.{key}", expected, value)


def checked_settings(method: str, settings_cls: type, values: Mapping[str, Any]) -> Any:
    """Return the settings as an instance of the frozen ``settings_cls``: ``values`` over the
    defaults, types and ranges checked (frozen: neither half can change what the other reads).

    Unknown keys, values of the wrong type (OmegaConf's conversion rules, as at composition)
    and values out of range (the dataclass's ``__post_init__``) raise a one-line ConfigError
    naming ``method.settings.<key>``.
    """
    known = [f.name for f in dataclasses.fields(settings_cls)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"method {method!r} has no setting(s) {unknown}; known: {sorted(known)}")
    try:
        node = OmegaConf.merge(OmegaConf.structured(settings_cls), dict(values))
        obj = OmegaConf.to_object(node)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or getattr(err, "key", None) or "?"
        message = str(getattr(err, "msg", err)).splitlines()[0]
        raise ConfigError(f"method.settings.{key}: {message}") from err
    if not settings_cls.__dataclass_params__.frozen:
        raise TypeError(f"method {method!r}: its settings dataclass {settings_cls.__name__} "
                        "must be frozen (@dataclass(frozen=True))")
    return obj
