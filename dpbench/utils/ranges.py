"""Range checks and their messages, in one place: ``<key> must be <expected> (got <value>)``.

Every check names the key the user set (``privacy.clip_norm``, ``method.settings.beta``), says
what is accepted, and shows what was given, as one line (a ConfigError: exit 2 before any
training or privacy spending). ``why`` adds the reason or the way out after the value.
"""

from __future__ import annotations

import math
from typing import Any

from dpbench.errors import ConfigError

_UNSET = object()


def is_number(value: Any) -> bool:
    """Return True for an int or float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_int(value: Any) -> bool:
    """Return True for an int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def refusal(key: str, expected: str, value: Any = _UNSET, *, shown: str | None = None,
            why: str = "") -> ConfigError:
    """Return the ConfigError ``<key> must be <expected> (got <value>)<why>``; ``shown`` is the
    value as printed (``repr`` by default); without a value there is no ``(got ...)``."""
    got = "" if value is _UNSET and shown is None else \
        f" (got {shown if shown is not None else repr(value)})"
    return ConfigError(f"{key} must be {expected}{got}{why}")


def require(ok: bool, key: str, expected: str, value: Any = _UNSET, *,
            shown: str | None = None, why: str = "") -> None:
    """Raise ``refusal(key, expected, value, ...)`` unless ``ok``."""
    if not ok:
        raise refusal(key, expected, value, shown=shown, why=why)


def positive(key: str, value: Any, allow_none: bool = False) -> None:
    """Require a number > 0 (NaN refused; infinity is the caller's to refuse or accept)."""
    if value is None and allow_none:
        return
    require(value is not None and is_number(value) and not math.isnan(value) and value > 0,
            key, "a number > 0", value)


def positive_finite(key: str, value: Any) -> None:
    """Require a finite number > 0."""
    require(is_number(value) and math.isfinite(value) and value > 0, key,
            "a finite number > 0", value)


def int_at_least(key: str, value: Any, low: int, allow_none: bool = False) -> None:
    """Require an integer >= ``low`` (or None when ``allow_none``)."""
    if value is None and allow_none:
        return
    require(is_int(value) and value >= low, key,
            f"an integer >= {low}{' or null' if allow_none else ''}", value)


def in_range(key: str, value: Any, low: float, high: float, *, closed: str = "[]",
             integer: bool = False, expected: str | None = None, shown: str | None = None,
             why: str = "", allow_none: bool = False) -> None:
    """Require a number (an integer when ``integer``) in the interval from ``low`` to ``high``;
    ``closed`` says which ends belong to it ("[]", "[)", "(]", "()"). ``expected`` replaces the
    interval as written in the message (e.g. "(0, 1/N)")."""
    if value is None and allow_none:
        return
    left, right = closed
    ok = (is_int(value) if integer else is_number(value)) and not math.isnan(value) and (
        value >= low if left == "[" else value > low) and (
        value <= high if right == "]" else value < high)
    if expected is None:
        kind = "an integer" if integer else "a number"
        expected = f"{kind} in {left}{low:g}, {high:g}{right}" + (" or null" if allow_none
                                                                    else "")
    require(ok, key, expected, value, shown=shown, why=why)
