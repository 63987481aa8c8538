"""Training callbacks tests share."""

from __future__ import annotations

from dpbench.training.loop import Callback


class Crash(Callback):
    """Simulates a kill in the middle of epoch ``epoch`` (after ``after`` steps of it)."""

    def __init__(self, epoch: int, after: int) -> None:
        self.epoch, self.after, self.seen = epoch, after, 0

    def on_step_end(self, trainer, metrics):
        if trainer.epoch == self.epoch - 1:
            self.seen += 1
            if self.seen == self.after:
                raise KeyboardInterrupt("simulated kill")
