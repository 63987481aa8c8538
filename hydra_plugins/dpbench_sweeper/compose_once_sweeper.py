"""dpbench's sweeper: Hydra's basic sweeper with each job's configuration composed once.

Hydra finds sweepers only in the ``hydra_plugins`` namespace; the loader that keeps the
compositions is ``dpbench.config.compose_once`` (docs/reliability-bad-input.md, "What Hydra
runs"; docs/engine.md, "Start-up").
"""

from __future__ import annotations

from typing import Any

from hydra._internal.core_plugins import basic_sweeper
from hydra.types import HydraContext

from dpbench.config.compose_once import ComposedOnce


class ComposeOnceSweeper(basic_sweeper.BasicSweeper):
    """The basic sweeper (same jobs, same order, every job composed before the first runs),
    whose launcher runs the very configuration each job was validated with."""

    def setup(self, *, hydra_context: HydraContext, task_function: Any, config: Any) -> None:
        shared = HydraContext(config_loader=ComposedOnce(hydra_context.config_loader),
                              callbacks=hydra_context.callbacks)
        super().setup(hydra_context=shared, task_function=task_function, config=config)
