"""The local results store: one atomic ``results.json`` per run, read back by the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from dpbench.logging.records import COMPLETED, RUNNING, base_record, run_record, write_record
from dpbench.training.loop import Callback, LoopView


class ResultsStore(Callback):
    """Writes results.json after every epoch (status ``running``) and at the end."""

    needs_record = True  # the loop hands the record so far at each epoch's end

    def __init__(self, cfg: DictConfig, run_dir: Path) -> None:
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self._base: dict[str, Any] | None = None  # the config's fields, resolved once a run

    def _record(self, summary: dict[str, Any], status: str) -> dict[str, Any]:
        if self._base is None:
            self._base = base_record(self.cfg)
        return run_record(self.cfg, summary, status, self._base)

    def on_epoch_end(self, view: LoopView, metrics: dict[str, Any]) -> None:
        if view.epoch < view.settings.epochs:
            # superseded at the next epoch's end: atomic and signed, not forced to disk
            write_record(self.run_dir, self._record(dict(view.record), RUNNING),
                         durable=False)

    def on_run_end(self, view: LoopView, result: dict[str, Any]) -> None:
        write_record(self.run_dir, self._record(result, COMPLETED))
