"""A tqdm progress bar per epoch showing loss and epsilon spent so far (CLI layer only)."""

from __future__ import annotations

import math
from typing import Any

from tqdm.auto import tqdm

from dpbench.privacy.samplers import RELATION_LABEL
from dpbench.training.loop import Callback, Trainer


class ProgressBar(Callback):
    def __init__(self) -> None:
        self.bar = None
        self.epsilon = 0.0

    def _open(self, trainer: Trainer) -> None:
        self.bar = tqdm(total=trainer.plan.steps_per_epoch, leave=False, dynamic_ncols=True,
                        disable=None,
                        desc=f"epoch {trainer.epoch + 1}/{trainer.settings.epochs}")

    def on_run_start(self, trainer: Trainer) -> None:
        self.epsilon = trainer.epsilon() if trainer.plan.private else math.inf

    def on_step_end(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        if self.bar is None:
            self._open(trainer)
        self.bar.update(1)
        self.bar.set_postfix(eps=f"{self.epsilon:.3g}")  # the training loss is not released

    def on_epoch_end(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        self.epsilon = metrics["epsilon"]
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        acc = metrics.get("accuracy")
        relation = RELATION_LABEL[trainer.plan.sampling.neighbouring]
        tqdm.write(f"epoch {trainer.epoch}/{trainer.settings.epochs}  eps {self.epsilon:.4g} "
                   f"({relation})"
                   + (f"  test accuracy {acc:.4f}" if acc is not None else ""))
