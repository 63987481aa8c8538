"""Name -> class registries with a decorator and a Python entry-point group.

Modelled on Opacus's ``register_grad_sampler`` / ``create_accountant``: a dict, a decorator that
refuses duplicate names, and a lookup whose error lists the known names. Outside packages add
entries through an entry-point group (for methods: ``dpbench.methods``), loaded on the first
lookup of a name that is not built in.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import pkgutil
import re
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

from dpbench.errors import ConfigError

T = TypeVar("T")
_UNEXPECTED = re.compile(r"unexpected keyword argument '(\w+)'")
log = logging.getLogger(__name__)


class Registry(Generic[T]):
    """A named collection of classes (or factories) of one kind."""

    def __init__(self, kind: str, entry_point_group: str | None = None,
                 builtin_package: str | None = None, config_group: str | None = None,
                 framework_keys: tuple[str, ...] = (),
                 check: Callable[[str, Any], None] | None = None) -> None:
        self.kind = kind
        #: ``check(name, entry)``, called on every entry before it is registered (built-in or
        #: plug-in); raises to refuse
        self.check = check
        self.entry_point_group = entry_point_group
        self.builtin_package = builtin_package
        #: set for builders called with a config group's keys (``dataset``, ``model``): each is
        #: wrapped so that a key it does not take is refused, naming ``<group>.<key>``
        self.config_group = config_group
        #: keys of the group the framework reads itself (dropped unless the builder takes them)
        self.framework_keys = frozenset(framework_keys)
        self._entries: dict[str, T] = {}
        self._builtins_loaded = self._plugins_loaded = False

    def register(self, name: str, settings_from: Callable | None = None) -> Callable[[T], T]:
        """Return a decorator that registers its argument under ``name``.

        ``settings_from``: for a builder that forwards ``**settings`` to another function, that
        function, whose keyword parameters with defaults are the builder's settings too (so an
        unknown key is refused before the builder runs).
        """

        def decorator(obj: T) -> T:
            if self.check is not None:
                self.check(name, obj)
            known = self._entries.get(name)
            if known is not None and known is not obj and getattr(
                    known, "__wrapped__", None) is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = (self._strict(name, obj, settings_from)
                                   if self.config_group and known is None and callable(obj)
                                   and not isinstance(obj, type) else
                                   known if known is not None else obj)
            if isinstance(obj, type) and not getattr(obj, "name", None):
                obj.name = name  # type: ignore[attr-defined]
            return obj

        return decorator

    def _strict(self, name: str, builder: Callable,
                settings_from: Callable | None = None) -> Callable:
        """Return ``builder`` refusing keyword settings it does not take (ConfigError naming
        ``<group>.<key>``). A builder that forwards ``**settings`` elsewhere without declaring
        ``settings_from`` is refused by the function it forwards to; its TypeError becomes the
        same one-line error."""
        params = inspect.signature(builder).parameters.values()
        named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        forwards = any(p.kind == p.VAR_KEYWORD for p in params)
        if settings_from is not None:
            named |= {p.name for p in inspect.signature(settings_from).parameters.values()
                      if p.default is not p.empty}
        strict = not forwards or settings_from is not None
        group, kind = self.config_group, self.kind

        def refuse(key: str) -> ConfigError:
            known = ", ".join(sorted(named - {"input_shape", "num_classes", "data"}))
            return ConfigError(f"{group}.{key}: {kind} {name!r} has no setting {key!r}"
                               + (f" (its settings: {known or 'none'})" if strict else ""))

        def check(settings: dict) -> list[str]:
            unknown = sorted(k for k in settings if k not in named
                             and k not in self.framework_keys)
            if unknown and strict:
                raise refuse(unknown[0])
            return unknown

        @functools.wraps(builder)
        def build(*args, **settings):
            settings = {k: v for k, v in settings.items()
                        if k in named or k not in self.framework_keys}
            unknown = check(settings)
            if not forwards:
                settings = {k: v for k, v in settings.items() if k in named}
            try:
                return builder(*args, **settings)
            except TypeError as err:
                match = _UNEXPECTED.search(str(err))
                if forwards and match and match.group(1) in unknown:
                    raise refuse(match.group(1)) from err
                raise

        build.check_settings = check  # type: ignore[attr-defined]
        return build

    def check_settings(self, name: str, settings: dict) -> None:
        """Raise ConfigError if the builder ``name`` would refuse a key of ``settings`` (and
        for an unknown name), without building anything."""
        check = getattr(self.get(name), "check_settings", None)
        if check is not None:
            check(settings)

    def load_builtins(self) -> None:
        """Import the built-in modules once: the modules of ``builtin_package`` (all but
        ``base`` and private ones), which register through the decorator when imported."""
        if self._builtins_loaded:
            return
        self._builtins_loaded = True
        if self.builtin_package is not None:
            package = importlib.import_module(self.builtin_package)
            for info in pkgutil.iter_modules(package.__path__):
                if info.name != "base" and not info.name.startswith("_"):
                    importlib.import_module(f"{self.builtin_package}.{info.name}")

    def builtin_names(self) -> list[str]:
        """Return the names registered without loading any entry point (the built-ins and
        whatever was registered already)."""
        self.load_builtins()
        return sorted(self._entries)

    def load_plugins(self) -> None:
        """Import the built-in modules and every entry point of the group, once.

        Entry points are imported only when a name is not built in (``get``) or every name is
        listed: an entry point is code from whatever ``sys.path`` holds (``python -m`` puts
        the current folder on it; docs/reliability-bad-input.md).
        """
        self.load_builtins()
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        if self.entry_point_group is None:
            return
        for ep in entry_points(group=self.entry_point_group):
            obj = ep.load()
            self.register(ep.name)(obj)  # a name clash with a built-in is refused

    def get(self, name: str) -> T:
        """Return the entry registered as ``name``; the error lists every known name."""
        if name not in self._entries:
            self.load_builtins()
        if name not in self._entries:  # not built in: an outside package's, by entry point
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
