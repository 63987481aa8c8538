"""The local results store: one atomic ``results.json`` per run, read back by the report."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from dpbench.logging.records import COMPLETED, RUNNING, base_record, write_record
from dpbench.privacy.composition import composed_relation
from dpbench.privacy.selection import search_and_run_epsilon
from dpbench.training.loop import Callback, LoopView


def run_record(cfg: DictConfig, summary: dict[str, Any], status: str,
               base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Return the record of a run: ``base`` (``base_record(cfg)``, computed if not given),
    the trainer's summary and the status."""
    record = {**(base_record(cfg) if base is None else base), **summary, "status": status}
    record["tuning"] = dict(record["tuning"])  # a shared ``base`` is never modified
    tuning = cfg.get("tuning")
    if tuning is not None and tuning.get("mode") == "accounted" and summary.get("private"):
        record["tuning"]["total_epsilon"] = search_and_run_epsilon(
            list(tuning.get("search_ledger") or []),
            float(tuning.get("selection_epsilon") or 0.0), summary["privacy_ledger"],
            summary["epsilon"], summary["delta"], summary["accountant"])
        # the relation the total holds under (the search's and the run's, composed)
        record["tuning"]["total_epsilon_neighbouring"] = composed_relation(
            [list(tuning.get("search_ledger") or []), summary["privacy_ledger"]])
    if not summary.get("private", True):
        record["method"] = "nonprivate"
        record["epsilon"] = math.inf
    return record


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
            write_record(self.run_dir, self._record(dict(view.record), RUNNING))

    def on_run_end(self, view: LoopView, result: dict[str, Any]) -> None:
        write_record(self.run_dir, self._record(result, COMPLETED))
