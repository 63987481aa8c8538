"""dpbench's sweeper: Hydra's basic sweeper with each job's configuration composed once.

Hydra finds sweepers only in the ``hydra_plugins`` namespace; the loader that keeps the
compositions is ``dpbench.config.compose_once`` (docs/reliability-bad-input.md, "What Hydra
runs"; docs/engine.md, "Start-up").

A job that cannot be composed (``trainer.epochs=1,abc``) is refused in one line naming the
key, exit 2, before any job of the sweep starts; the ``multirun.yaml`` Hydra wrote for it and
the sweep folder this command created are removed again (``bad_sweep``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins import basic_sweeper
from hydra.errors import HydraException
from hydra.types import HydraContext
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dpbench.config.compose_once import ComposedOnce, bad_sweep, composition_error


class ComposeOnceSweeper(basic_sweeper.BasicSweeper):
    """The basic sweeper (same jobs, same order, every job composed before the first runs),
    whose launcher runs the very configuration each job was validated with."""

    def setup(self, *, hydra_context: HydraContext, task_function: Any, config: Any) -> None:
        shared = HydraContext(config_loader=ComposedOnce(hydra_context.config_loader),
                              callbacks=hydra_context.callbacks)
        self._launched = False
        super().setup(hydra_context=shared, task_function=task_function, config=config)

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        try:
            super().validate_batch_is_legal(batch)
        except (HydraException, OmegaConfBaseException) as err:
            # before the first launch nothing of the sweep ran: what it wrote goes again
            bad_sweep(composition_error(err), self._sweep_dir(), nothing_ran=not self._launched)
        self._launched = True

    def _sweep_dir(self) -> Path:
        return Path(os.path.abspath(str(OmegaConf.select(self.config, "hydra.sweep.dir"))))
