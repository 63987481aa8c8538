"""Reliability diagram (Guo et al. 2017, Fig. 1) of a run's final predictions, PNG + W&B.

Reads the per-bin confidence/accuracy/count that the classification task reports
(``reliability_*`` in the final metrics); runs without them are left alone.
"""

from __future__ import annotations

import io
import logging
import math
import sys
from pathlib import Path
from typing import Any

from dpbench.training.loop import Callback, LoopView
from dpbench.utils.io import atomic_write_bytes

log = logging.getLogger(__name__)
DIAGRAM_NAME = "reliability.png"


def plot_reliability(confidence: list[float], accuracy: list[float], count: list[float],
                     path: Path, title: str = "", ece: float | None = None) -> Path:
    """Write a reliability diagram (accuracy per confidence bin vs the diagonal) to ``path``.

    Drawn on a bare ``Figure`` with a fixed layout: neither pyplot (its import and global
    figure list) nor ``tight_layout`` (a second draw), a fixed cost of every classification
    run (docs/engine.md, "Start-up")."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n_bins = len(count)
    width = 1.0 / n_bins
    lefts = [k * width for k in range(n_bins)]
    empty = [n == 0 or math.isnan(a) for n, a in zip(count, accuracy)]  # drawn as nothing
    acc = [0.0 if e else a for e, a in zip(empty, accuracy)]
    conf = [0.0 if e else c for e, c in zip(empty, confidence)]
    fig = Figure(figsize=(4, 5))
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.bar(lefts, acc, width=width, align="edge", edgecolor="black", label="accuracy")
    top.bar(lefts, [c - a for c, a in zip(conf, acc)], bottom=acc, width=width, align="edge",
            color="red", alpha=0.3, edgecolor="red", label="gap to confidence")
    top.plot([0, 1], [0, 1], "k--", linewidth=1)
    top.set_ylabel("accuracy")
    top.set_ylim(0, 1)
    top.legend(loc="upper left", fontsize=8)
    top.set_title(title + (f"  ECE {ece:.3f}" if ece is not None else ""), fontsize=9)
    total = max(sum(count), 1.0)
    bottom.bar(lefts, [c / total for c in count], width=width, align="edge", edgecolor="black")
    bottom.set_xlabel("confidence")
    bottom.set_ylabel("share")
    bottom.set_xlim(0, 1)
    fig.subplots_adjust(left=0.17, right=0.96, top=0.93, bottom=0.1, hspace=0.08)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    atomic_write_bytes(path, buffer.getvalue())  # a planted link is replaced, not followed
    return path


class ReliabilityDiagram(Callback):
    """Writes ``reliability.png`` into the run directory at the end; logs it to an open W&B run.

    Place it before the W&B sink in the callback list (the sink closes its run at the end).
    """

    def __init__(self, run_dir: str | Path, title: str = "") -> None:
        self.run_dir, self.title = Path(run_dir), title

    def on_run_end(self, view: LoopView, result: dict[str, Any]) -> None:
        m = result.get("metrics", {})
        if not all(f"reliability_{k}" in m for k in ("confidence", "accuracy", "count")):
            return
        path = plot_reliability(m["reliability_confidence"], m["reliability_accuracy"],
                                m["reliability_count"], self.run_dir / DIAGRAM_NAME,
                                title=self.title, ece=m.get("ece"))
        wandb = sys.modules.get("wandb")  # the loop never imports wandb; log only if it is open
        if wandb is not None and getattr(wandb, "run", None) is not None:
            wandb.run.log({"eval/reliability_diagram": wandb.Image(str(path))})
        log.info("reliability diagram in %s", path)
