"""Weights & Biases sink: config, per-step released values, per-epoch evaluation, summary.

Per step it logs only released quantities and their post-processing (``train/``); the loop's
un-privatised training diagnostics (loss, gradient norms, realised batch size) are logged
under ``unprivatised/`` only when asked: ``unprivatised_diagnostics=True`` (the name of the
results.json key), or ``logger.private_diagnostics=true``, the older name the logger configs
still use.

Offline by default (``WANDB_MODE=offline`` needs no account or network); files go under the
run directory. The loop never imports wandb: this callback subscribes to its events.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dpbench.training.loop import Callback, LoopView

log = logging.getLogger(__name__)


class WandbSink(Callback):
    def __init__(self, mode: str = "offline", project: str = "dpbench", entity: str | None = None,
                 group: str | None = None, run_dir: str | Path | None = None,
                 cfg: DictConfig | None = None, name: str | None = None,
                 private_diagnostics: bool = False,
                 unprivatised_diagnostics: bool | None = None) -> None:
        self.mode, self.project, self.entity, self.group = mode, project, entity, group
        # the new name wins where both are given
        self.unprivatised_diagnostics = bool(private_diagnostics if unprivatised_diagnostics
                                             is None else unprivatised_diagnostics)
        self.run_dir = Path(run_dir) if run_dir else None
        self.cfg, self.name = cfg, name
        self.run = None

    @property
    def needs_step_quantiles(self) -> bool:  # type: ignore[override]
        """The loop computes the gradient-norm quantiles only for a sink that logs them."""
        return self.unprivatised_diagnostics

    def on_run_start(self, view: LoopView) -> None:
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        config = OmegaConf.to_container(self.cfg, resolve=True) if self.cfg is not None else {}
        self.run = wandb.init(
            mode=self.mode, project=self.project, entity=self.entity, group=self.group,
            name=self.name, dir=str(self.run_dir) if self.run_dir else None, config=config,
            resume="allow" if view.settings.resume else None,
            reinit="finish_previous",
        )
        self.run.config.update({"noise_multiplier": view.plan.noise_multiplier,
                                "sample_rate": view.plan.sample_rate,
                                "planned_steps": view.plan.total_steps},
                               allow_val_change=True)

    def on_step_end(self, view: LoopView, metrics: dict[str, float]) -> None:
        if self.run is not None:
            logged = {f"train/{k}": v for k, v in metrics.items()
                      if isinstance(v, (int, float)) and not math.isnan(v)}
            if self.unprivatised_diagnostics:  # opted in: un-privatised, not covered by epsilon
                logged.update({f"unprivatised/{k}": v
                               for k, v in metrics.get("unprivatised", {}).items()
                               if isinstance(v, (int, float)) and not math.isnan(v)})
            self.run.log(logged, step=view.step)

    def on_epoch_end(self, view: LoopView, metrics: dict[str, Any]) -> None:
        if self.run is not None:
            flat = {f"eval/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))}
            self.run.log(flat, step=view.step)

    def on_run_end(self, view: LoopView, result: dict[str, Any]) -> None:
        if self.run is None:
            return
        for k, v in result["metrics"].items():
            if isinstance(v, (int, float)):
                self.run.summary[k] = v
        for k in ("epsilon", "target_epsilon", "delta", "noise_multiplier", "sample_rate",
                  "steps", "accountant"):
            self.run.summary[k] = result.get(k)
        self.run.finish()
        self.run = None

    def close(self, failed: bool = False) -> None:
        if self.run is not None:
            self.run.finish(exit_code=1 if failed else 0)
            self.run = None
