"""Name -> class registries with a decorator and a Python entry-point group.

Modelled on Opacus's ``register_grad_sampler`` / ``create_accountant``: a dict, a decorator that
refuses duplicate names, and a lookup whose error lists the known names. Outside packages add
entries through an entry-point group (for methods: ``dpbench.methods``), loaded on first lookup.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from dpbench.errors import ConfigError

T = TypeVar("T")
log = logging.getLogger(__name__)


class Registry(Generic[T]):
    """A named collection of classes (or factories) of one kind."""

    def __init__(self, kind: str, entry_point_group: str | None = None,
                 builtin_package: str | None = None) -> None:
        self.kind = kind
        self.entry_point_group = entry_point_group
        self.builtin_package = builtin_package
        self._entries: dict[str, T] = {}
        self._plugins_loaded = False

    def register(self, name: str) -> Callable[[T], T]:
        """Return a decorator that registers its argument under ``name``."""

        def decorator(obj: T) -> T:
            if name in self._entries and self._entries[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = obj
            if isinstance(obj, type) and not getattr(obj, "name", None):
                obj.name = name  # type: ignore[attr-defined]
            return obj

        return decorator

    def load_plugins(self) -> None:
        """Import the built-in modules and every entry point of the group, once.

        Built-ins are the modules of ``builtin_package`` (all but ``base`` and private ones);
        they register through the decorator when imported.
        """
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        if self.builtin_package is not None:
            package = importlib.import_module(self.builtin_package)
            for info in pkgutil.iter_modules(package.__path__):
                if info.name != "base" and not info.name.startswith("_"):
                    importlib.import_module(f"{self.builtin_package}.{info.name}")
        if self.entry_point_group is None:
            return
        for ep in entry_points(group=self.entry_point_group):
            obj = ep.load()
            self.register(ep.name)(obj)  # a name clash with a built-in is refused

    def get(self, name: str) -> T:
        """Return the entry registered as ``name``; the error lists every known name."""
        if name not in self._entries:
            self.load_plugins()
        if name not in self._entries:
            known = ", ".join(sorted(self.names())) or "(none)"
            raise ConfigError(f"unknown {self.kind} {name!r}; registered: {known}")
        return self._entries[name]

    def names(self) -> list[str]:
        self.load_plugins()
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        self.load_plugins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
