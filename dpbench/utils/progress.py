"""Overall progress of a long command: units done of a total, time elapsed and an ETA from
the pace so far (``dpbench-reproduce``, ``dpbench-tune``)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def minutes(seconds: float) -> str:
    """Return ``seconds`` as minutes with one decimal (``12.3 min``)."""
    return f"{seconds / 60:.1f} min"


class Progress:
    """Counts ``total`` units (runs, cells) and prints one line per update: done / total,
    elapsed, and the ETA elapsed / done * (total - done) once anything is done."""

    def __init__(self, total: int, unit: str, prog: str, stream: TextIO | None = None,
                 clock=time.perf_counter) -> None:
        self.total, self.unit, self.prog = max(0, int(total)), unit, prog
        self.done = 0
        self._clock = clock
        self._start = clock()
        self._stream = stream

    def elapsed(self) -> float:
        return self._clock() - self._start

    def eta(self) -> float | None:
        """Seconds left at the pace so far; None before the first unit is done."""
        if self.done <= 0:
            return None
        return self.elapsed() / self.done * max(0, self.total - self.done)

    def line(self) -> str:
        eta = self.eta()
        share = f" ({100 * self.done / self.total:.0f} %)" if self.total else ""
        return (f"{self.prog}: {self.done}/{self.total} {self.unit} done{share}, "
                f"{minutes(self.elapsed())} elapsed, ETA "
                + (minutes(eta) if eta is not None else "—"))

    def advance(self, units: int = 1, summary: str = "") -> str:
        """Count ``units`` more done; print the summary (if any) and the progress line."""
        self.done = min(self.total, self.done + units) if self.total else self.done + units
        text = (f"{self.prog}: {summary}\n" if summary else "") + self.line()
        print(text, file=self._stream or sys.stdout, flush=True)
        return text
