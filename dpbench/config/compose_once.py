"""A Hydra config loader that composes each job of a sweep once.

Hydra's basic sweeper composes every job of a batch to find a bad override before any job
starts (``Sweeper.validate_batch_is_legal``); the launcher then composes each job again to run
it, so a sweep of K jobs cost 2K compositions. ``ComposedOnce`` wraps the sweep's config
loader: the composition made while validating is kept and handed, once, to the launcher's
request for the same job. Validation itself is unchanged (every job is still composed before
the first one starts), and a job's config is the object Hydra composed for it, never another
job's (the key is the job's own overrides; each kept config is handed out once).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any, NoReturn

from hydra.core.config_loader import ConfigLoader
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from dpbench.utils.io import remove_created, take_created

#: most compositions kept at once; a larger batch composes the rest again (as Hydra does)
MAX_KEPT = 1024


class ComposedOnce(ConfigLoader):
    """Delegate to ``inner``; ``load_sweep_config`` keeps each job's composition for one
    later request of the same job (``compositions`` counts the ones actually made)."""

    def __init__(self, inner: ConfigLoader) -> None:
        self.inner = inner
        self.kept: dict[tuple[int, tuple[str, ...]], DictConfig] = {}
        self.compositions = 0

    def load_sweep_config(self, master_config: DictConfig,
                          sweep_overrides: list[str]) -> DictConfig:
        key = (id(master_config), tuple(sweep_overrides))
        if key in self.kept:
            return self.kept.pop(key)  # handed out once: the launcher's own copy
        self.compositions += 1
        composed = self.inner.load_sweep_config(master_config, list(sweep_overrides))
        if len(self.kept) < MAX_KEPT:
            # for the next request of this job: validation only composes and drops it, the
            # launcher then sets the job's number on it and runs it
            self.kept[key] = composed
        return composed

    def load_configuration(self, *args: Any, **kwargs: Any) -> DictConfig:
        return self.inner.load_configuration(*args, **kwargs)

    def get_search_path(self) -> Any:
        return self.inner.get_search_path()

    def get_sources(self) -> Any:
        return self.inner.get_sources()

    def list_groups(self, parent_name: str) -> Any:
        return self.inner.list_groups(parent_name)

    def get_group_options(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.get_group_options(*args, **kwargs)

    def compute_defaults_list(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.compute_defaults_list(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # anything else a plugin may ask of a loader
        if name.startswith("__") or name in ("inner", "kept", "compositions"):
            raise AttributeError(name)  # e.g. while unpickled in a joblib worker
        return getattr(self.inner, name)


def composition_error(err: BaseException) -> str:
    """Return one line for a job that cannot be composed: the key OmegaConf names (its
    ``full_key``) and the first line of the innermost error."""
    key, inner = "", err
    probe: BaseException | None = err
    while probe is not None:
        if isinstance(probe, OmegaConfBaseException):
            # OmegaConf re-raises its error formatted: the first one says it best
            inner = probe
            key = str(getattr(probe, "full_key", "") or "")
            break
        if isinstance(probe, HydraException):
            inner = probe
        key = str(getattr(probe, "full_key", "") or "") or key
        probe = probe.__cause__ or probe.__context__
    text = next((line.strip() for line in str(inner).splitlines() if line.strip()),
                type(inner).__name__)
    return f"{key}: {text}" if key and not text.startswith(key) else text


def bad_sweep(message: str, sweep_dir: Path, nothing_ran: bool) -> NoReturn:
    """Refuse a sweep one of whose jobs cannot be composed: one line, exit 2. When no job ran
    yet, the ``multirun.yaml`` Hydra wrote and the folders this command created for the sweep
    (``utils.io.record_created``) are removed; anything else stays. Only ``dpbench``'s own
    config (``conf/config.yaml``) selects this sweeper, hence the program's name."""
    if nothing_ran:
        with contextlib.suppress(OSError):
            (sweep_dir / "multirun.yaml").unlink()
        remove_created(take_created(sweep_dir))
    print(f"dpbench: error: a job of the sweep cannot be composed: {message}",
          file=sys.stderr)
    sys.exit(2)
