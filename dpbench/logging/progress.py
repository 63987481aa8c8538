"""A tqdm progress bar per epoch showing loss and epsilon spent so far (CLI layer only)."""

from __future__ import annotations

import math
from typing import Any

from tqdm.auto import tqdm

from dpbench.privacy.samplers import RELATION_LABEL
from dpbench.training.loop import Callback, LoopView


class ProgressBar(Callback):
    def __init__(self) -> None:
        self.bar = None
        self.epsilon = 0.0

    def _open(self, view: LoopView) -> None:
        self.bar = tqdm(total=view.plan.steps_per_epoch, leave=False, dynamic_ncols=True,
                        disable=None,
                        desc=f"epoch {view.epoch + 1}/{view.settings.epochs}")

    def on_run_start(self, view: LoopView) -> None:
        self.epsilon = view.epsilon if view.plan.private else math.inf

    def on_step_end(self, view: LoopView, metrics: dict[str, float]) -> None:
        if self.bar is None:
            self._open(view)
        self.bar.update(1)
        self.bar.set_postfix(eps=f"{self.epsilon:.3g}")  # the training loss is not released

    def on_epoch_end(self, view: LoopView, metrics: dict[str, Any]) -> None:
        self.epsilon = metrics["epsilon"]
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        acc = metrics.get("accuracy")
        relation = RELATION_LABEL[view.plan.sampling.neighbouring]
        tqdm.write(f"epoch {view.epoch}/{view.settings.epochs}  eps {self.epsilon:.4g} "
                   f"({relation})"
                   + (f"  test accuracy {acc:.4f}" if acc is not None else ""))
