"""Which ``_target_`` a config may name: an allow-list of factories, checked before Hydra's
``instantiate`` runs anything.

A ``_target_`` is an import path that ``hydra.utils.instantiate`` calls. Hydra refuses only a
few names (``os.system``, ``exec``, ``subprocess``); ``torch.load``, ``pandas.read_pickle`` or
``pathlib.Path.unlink`` would run, so a config from a shared folder or a sweep spec could
execute code or delete files. dpbench therefore instantiates only (docs/reliability-bad-input.md,
"Files from others"):

- optimisers: classes derived from ``torch.optim.Optimizer`` in a module that is already
  imported (``torch.optim``'s, dpbench's, a plugin's); naming one imports nothing, so a
  ``_target_`` can never make Python import and run a module of its choice;
- dpbench's own factories (``DPBENCH_FACTORIES``);
- factories an installed package declares in the entry-point group ``dpbench.factories``
  (``name = "pkg.module:Factory"`` allows ``pkg.module.Factory``).

Anything else is refused in one line naming the key.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from dpbench.errors import ConfigError

#: dpbench's own classes a config may instantiate
DPBENCH_FACTORIES = frozenset({
    "dpbench.methods.dpadam_bc.AdamBC",
    "dpbench.methods.ivon.IVONOptimizer",
    "dpbench.logging.wandb_sink.WandbSink",
    "dpbench.cli.RunDirGuard",
})
#: entry-point group through which outside packages allow their own factories
ENTRY_POINT_GROUP = "dpbench.factories"


@functools.lru_cache(maxsize=1)
def _plugin_factories() -> frozenset[str]:
    return frozenset(ep.value.replace(":", ".") for ep in entry_points(group=ENTRY_POINT_GROUP))


def _loaded_optimizer(target: str) -> bool:
    """Return whether ``target`` names an Optimizer subclass of an already imported module."""
    import sys

    import torch

    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is None:
            continue
        obj: Any = module
        for name in parts[cut:]:
            if name.startswith("_"):
                return False
            obj = getattr(obj, name, None)
        return isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer)
    return False


def is_allowed_target(target: Any) -> bool:
    """Return whether ``target`` (a ``_target_`` value) is on the allow-list."""
    if not isinstance(target, str):
        return False
    return (target in DPBENCH_FACTORIES or target in _plugin_factories()
            or _loaded_optimizer(target))


def _targets(prefix: str, node: Any) -> Iterator[tuple[str, Any]]:
    """Yield (dotted key, value) of every ``_target_`` under ``node``."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "_target_":
                yield f"{prefix}._target_", value
            else:
                yield from _targets(f"{prefix}.{key}", value)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _targets(f"{prefix}[{i}]", value)


def check_targets(node: Any, key: str) -> None:
    """Raise ConfigError naming the key of the first ``_target_`` under ``node`` that is not
    allowed (``node`` is a config node, a dict or None)."""
    if isinstance(node, (DictConfig, ListConfig)):
        node = OmegaConf.to_container(node, resolve=True)
    for where, target in _targets(key, node):
        if not is_allowed_target(target):
            raise ConfigError(
                f"{where}={target!r} is not an allowed factory: configs may instantiate "
                "optimisers (torch.optim.Optimizer subclasses), dpbench's own factories and "
                "those a package declares "
                f"in the entry-point group {ENTRY_POINT_GROUP} "
                "(docs/reliability-bad-input.md)")
