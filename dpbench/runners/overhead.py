"""Per-step overhead of a method's post-processing, measured inside one run (interleaved).

Every step of the same run is timed twice: the whole step (between consecutive ``on_step_end``
events, read with ``dpbench-bench``'s ``stopwatch``) and the method's own post-processing
(``denoise_seconds`` in its step metrics), so both see the same machine load. Steps followed
by an evaluation are left out.

    python -m dpbench.runners.overhead experiment=spectral_sst2 privacy=eps8
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence
from typing import Any

from dpbench.bench_steps import stopwatch
from dpbench.training.loop import Callback, LoopView

TIMED_KEY = "denoise_seconds"


class StepTimer(Callback):
    """Records (step seconds, post-processing seconds) for every step without an evaluation."""

    def __init__(self, key: str = TIMED_KEY) -> None:
        self.key = key
        self.samples: list[tuple[float, float]] = []
        self._last: float | None = None
        self._eval_between = False

    def on_run_start(self, view: LoopView) -> None:
        self._last = stopwatch(view.device)

    def on_step_end(self, view: LoopView, metrics: dict[str, float]) -> None:
        now = stopwatch(view.device)
        if self._last is not None and not self._eval_between and self.key in metrics:
            self.samples.append((now - self._last, float(metrics[self.key])))
        every = view.settings.eval_every_steps
        self._eval_between = bool(every) and view.step % every == 0
        self._last = now

    def on_epoch_end(self, view: LoopView, metrics: dict[str, Any]) -> None:
        self._eval_between = True  # the next interval holds an evaluation

    def ratio(self) -> dict[str, float]:
        """Return post-processing time / rest of the step (total and median over steps)."""
        if not self.samples:
            raise ValueError(f"no step reported {self.key!r}")
        step = [s for s, _ in self.samples]
        post = [p for _, p in self.samples]
        return {"steps_timed": len(self.samples),
                "overhead_ratio": sum(post) / (sum(step) - sum(post)),
                "overhead_ratio_median": statistics.median(
                    p / (s - p) for s, p in self.samples),
                "step_seconds_median": statistics.median(step),
                "postprocess_seconds_median": statistics.median(post)}


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """Compose the config from Hydra overrides, train once with the timer; print the ratio."""
    from dpbench.config.compose import compose_config
    from dpbench.experiment import run
    from dpbench.spec import build_spec

    overrides = list(sys.argv[1:] if argv is None else argv)
    cfg = compose_config(["logger=none", "trainer.progress=false", "trainer.checkpoint=false",
                          *overrides])
    timer = StepTimer()
    run(build_spec(cfg), callbacks=[timer])
    result = timer.ratio()
    for k, v in result.items():
        print(f"{k}: {v:.4g}")
    return result


if __name__ == "__main__":
    main()
