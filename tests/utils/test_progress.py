"""Overall progress lines: done / total, elapsed and an ETA from the pace so far."""

from __future__ import annotations

import io

from dpbench.utils.progress import Progress


def test_progress_reports_the_eta_from_the_pace_so_far():
    now = [0.0]
    out = io.StringIO()
    progress = Progress(40, "runs", "dpbench-reproduce", stream=out, clock=lambda: now[0])
    assert progress.eta() is None and progress.line().endswith("ETA —")
    now[0] = 120.0
    text = progress.advance(10, "fiber/grid: 10 runs (0 failed) in 2.0 min")
    assert text.splitlines() == ["dpbench-reproduce: fiber/grid: 10 runs (0 failed) in 2.0 min",
                                 "dpbench-reproduce: 10/40 runs done (25 %), 2.0 min elapsed, "
                                 "ETA 6.0 min"]
    assert progress.eta() == 360.0 and out.getvalue() == text + "\n"
    now[0] = 480.0
    progress.advance(30)
    assert progress.eta() == 0.0 and "40/40 runs done (100 %)" in progress.line()
