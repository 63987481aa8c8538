"""Reliability diagram (Guo et al. 2017, Fig. 1) of a run's final predictions, PNG + W&B.

Reads the per-bin confidence/accuracy/count that the classification task reports
(``reliability_*`` in the final metrics); runs without them are left alone.
"""

from __future__ import annotations

import io
import logging
import math
import sys
import threading
from pathlib import Path
from typing import Any

from dpbench.training.loop import Callback, LoopView
from dpbench.utils.io import atomic_write_bytes

log = logging.getLogger(__name__)
DIAGRAM_NAME = "reliability.png"


def _bins(confidence: list[float], accuracy: list[float], count: list[float]
          ) -> tuple[list[float], list[float], list[float], list[float]]:
    """Return the bars' (lefts, accuracy, gaps, shares); a gap bar starts at its bin's
    accuracy; an empty bin is drawn as nothing (zero heights)."""
    n_bins = len(count)
    width = 1.0 / n_bins
    lefts = [k * width for k in range(n_bins)]
    empty = [n == 0 or math.isnan(a) for n, a in zip(count, accuracy)]
    acc = [0.0 if e else a for e, a in zip(empty, accuracy)]
    conf = [0.0 if e else c for e, c in zip(empty, confidence)]
    total = max(sum(count), 1.0)
    return lefts, acc, [c - a for c, a in zip(conf, acc)], [c / total for c in count]


def _title(title: str, ece: float | None) -> str:
    return title + (f"  ECE {ece:.3f}" if ece is not None else "")


class _Diagram:
    """One drawn diagram (a bare ``Figure``), redrawn for the next run's bins in place.

    Building the figure (its two axes, ticks, bars, legend) is about a third of a diagram's
    cost; a sweep's runs in one process (grouped seeds, an MIA cell's models) draw the same
    layout with other heights. ``redraw`` moves the bars and the title and rescales the
    share axis exactly as drawing anew would, so the PNG bytes are those of a new figure
    (tests/logging/test_reliability.py compares them)."""

    def __init__(self, confidence: list[float], accuracy: list[float], count: list[float],
                 title: str, ece: float | None) -> None:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        lefts, acc, gap, share = _bins(confidence, accuracy, count)
        width = 1.0 / len(count)
        self.n_bins = len(count)
        # the settings it was drawn with (``copy`` and ``dict.__eq__`` read the stored values:
        # reading rcParams["backend"] through the mapping would import pyplot)
        self.style = matplotlib.rcParams.copy()
        self.fig = fig = Figure(figsize=(4, 5))
        FigureCanvasAgg(fig)
        top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
        self.acc_bars = top.bar(lefts, acc, width=width, align="edge", edgecolor="black",
                                label="accuracy")
        self.gap_bars = top.bar(lefts, gap, bottom=acc, width=width, align="edge",
                                color="red", alpha=0.3, edgecolor="red",
                                label="gap to confidence")
        top.plot([0, 1], [0, 1], "k--", linewidth=1)
        top.set_ylabel("accuracy")
        top.set_ylim(0, 1)
        top.legend(loc="upper left", fontsize=8)
        top.set_title(_title(title, ece), fontsize=9)
        self.share_bars = bottom.bar(lefts, share, width=width, align="edge",
                                     edgecolor="black")
        bottom.set_xlabel("confidence")
        bottom.set_ylabel("share")
        bottom.set_xlim(0, 1)
        fig.subplots_adjust(left=0.17, right=0.96, top=0.93, bottom=0.1, hspace=0.08)
        self.top, self.bottom = top, bottom

    def fits(self, n_bins: int) -> bool:
        """Return whether a new figure for ``n_bins`` bins would be this one's layout (same
        bins, same matplotlib settings)."""
        import matplotlib

        return n_bins == self.n_bins and dict.__eq__(matplotlib.rcParams, self.style) is True

    def redraw(self, confidence: list[float], accuracy: list[float], count: list[float],
               title: str, ece: float | None) -> None:
        """Show other bins of the same number: what ``__init__`` would have drawn for them."""
        _, acc, gap, share = _bins(confidence, accuracy, count)
        for bars, bottoms, heights in ((self.acc_bars, None, acc),
                                       (self.gap_bars, acc, gap),
                                       (self.share_bars, None, share)):
            for k, (rect, height) in enumerate(zip(bars.patches, heights)):
                low = 0.0 if bottoms is None else bottoms[k]
                rect.set_y(low)
                rect.set_height(height)
                rect.sticky_edges.y[:] = [low]  # as ``bar`` sets them
        self.top.set_title(_title(title, ece), fontsize=9)
        self.bottom.relim()  # the share axis autoscales to its bars, as a new one would
        self.bottom.autoscale_view(scalex=False)

    def png(self) -> bytes:
        buffer = io.BytesIO()
        self.fig.savefig(buffer, format="png", dpi=100)
        return buffer.getvalue()


#: the last diagram drawn in this process, redrawn by the next run (under the lock: runs of
#: one process may end in different threads)
_LAST: list[_Diagram] = []
_LOCK = threading.Lock()


def reliability_png(confidence: list[float], accuracy: list[float], count: list[float],
                    title: str = "", ece: float | None = None) -> bytes:
    """Return the PNG of a reliability diagram (accuracy per confidence bin vs the diagonal).

    Drawn on a bare ``Figure`` with a fixed layout: neither pyplot (its import and global
    figure list) nor ``tight_layout`` (a second draw), a fixed cost of every classification
    run (docs/engine.md, "Start-up"); the figure is kept and redrawn for the process's next
    diagram of as many bins (``_Diagram``)."""
    with _LOCK:
        if _LAST and _LAST[0].fits(len(count)):
            _LAST[0].redraw(confidence, accuracy, count, title, ece)
        else:
            _LAST[:] = [_Diagram(confidence, accuracy, count, title, ece)]
        return _LAST[0].png()


def plot_reliability(confidence: list[float], accuracy: list[float], count: list[float],
                     path: Path, title: str = "", ece: float | None = None) -> Path:
    """Write a reliability diagram (``reliability_png``) to ``path``."""
    data = reliability_png(confidence, accuracy, count, title, ece)
    atomic_write_bytes(path, data)  # a planted link is replaced, not followed
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
