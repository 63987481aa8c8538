"""The reliability diagram callback writes a PNG for classification runs only."""

from __future__ import annotations

import torch

from dpbench.logging.reliability import DIAGRAM_NAME, ReliabilityDiagram
from dpbench.tasks.calibration import calibration_metrics


def test_reliability_diagram_png_is_written(tmp_path):
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.82, 0.08], [0.3, 0.3, 0.4]])
    metrics = calibration_metrics(probs.log(), torch.tensor([0, 1, 0]))
    ReliabilityDiagram(tmp_path, "test").on_run_end(None, {"metrics": metrics})
    png = (tmp_path / DIAGRAM_NAME).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    ReliabilityDiagram(tmp_path / "none").on_run_end(None, {"metrics": {"rmse": 1.0}})
    assert not (tmp_path / "none").exists()


def _drawn_anew(confidence, accuracy, count, title="", ece=None):
    """The diagram drawn on a new figure, exactly as before figures were kept (reference)."""
    import io
    import math

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n_bins = len(count)
    width = 1.0 / n_bins
    lefts = [k * width for k in range(n_bins)]
    empty = [n == 0 or math.isnan(a) for n, a in zip(count, accuracy)]
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
    return buffer.getvalue()


def test_a_kept_figure_redrawn_gives_the_bytes_of_a_new_one(tmp_path):
    """Runs of one process redraw one figure (``_Diagram.redraw``); every PNG must be the one
    a new figure gives: bars, title, the share axis's scale (all bins empty, one bin holding
    everything, counts of other sizes), and a change in the number of bins."""
    import random

    from dpbench.logging import reliability

    rng = random.Random(7)
    cases = []
    for i in range(9):
        bins = 15 if i < 7 else 10
        conf = [rng.random() for _ in range(bins)]
        acc = [rng.random() if rng.random() > 0.2 else float("nan") for _ in range(bins)]
        count = [float(rng.choice([0, 1, 5, 300, 1000])) for _ in range(bins)]
        if i == 2:
            count = [0.0] * bins
        if i == 3:
            count = [0.0] * (bins - 1) + [360.0]
        cases.append((conf, acc, count, "run" * (i % 3), None if i % 4 == 0 else rng.random()))
    reliability._LAST.clear()
    kept = []
    for conf, acc, count, title, ece in cases:
        path = reliability.plot_reliability(conf, acc, count, tmp_path / "r.png", title, ece)
        kept.append(reliability._LAST[0])
        assert path.read_bytes() == _drawn_anew(conf, acc, count, title, ece)
    assert kept[0] is kept[6] and kept[7] is kept[8] and kept[6] is not kept[7]  # redrawn
    # other matplotlib settings: a new figure, drawn with them
    import matplotlib

    conf, acc, count, title, ece = cases[-1]
    with matplotlib.rc_context({"font.size": 13}):
        path = reliability.plot_reliability(conf, acc, count, tmp_path / "r.png", title, ece)
        assert reliability._LAST[0] is not kept[-1]
        assert path.read_bytes() == _drawn_anew(conf, acc, count, title, ece)


def test_drawing_imports_no_pyplot():
    """The diagram is drawn without pyplot (its import and global figure list), redraws
    included (a fresh process: another test may have imported it)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from dpbench.logging.reliability import reliability_png\n"
            "for a in (0.5, 0.4):\n"
            "    reliability_png([0.5] * 10, [a] * 10, [1.0] * 10, 'run', 0.1)\n"
            "print('matplotlib.pyplot' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"
