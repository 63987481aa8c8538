"""Stop at a step boundary when the scheduler asks: SIGTERM, SIGUSR1, or submitit's signal.

A scheduler that preempts a job (SLURM sends SIGTERM, or the ``--signal`` of the job;
submitit uses ``SUBMITIT_PREEMPT_SIGNAL``, USR2 by default) may interrupt it anywhere, also
between a release and its accounting. The handler here only records the signal; the loop
looks at it after each whole step (released, accounted, applied), writes a checkpoint of
that state, the position inside the epoch included, and raises ``Preempted``. A run resumed
from it (``trainer.resume=true``, which a requeued job sets) continues the same accountant
and draws the same batches and noise as a run never stopped, so no step is released twice
and none is lost. Then the signal's earlier handler runs: under submitit that is its
checkpoint-and-requeue. See docs/distributed.md.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from dpbench.errors import DPBenchError

#: what a preempted ``dpbench`` run exits with (its checkpoint is on disk)
PREEMPTED_EXIT_CODE = 3


class Preempted(DPBenchError):
    """The run stopped at a step boundary on a scheduler's signal; its checkpoint is saved."""


def preemption_signals() -> list[signal.Signals]:
    """Return SIGTERM, SIGUSR1 and submitit's preemption signal (USR2 unless set)."""
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
    extra = getattr(signal, f"SIG{name}", None) or getattr(signal, name, None)
    out = [signal.SIGTERM, signal.SIGUSR1]
    if extra is not None and extra not in out:
        out.append(extra)
    return out


class PreemptionWatch:
    """Records the first preemption signal; ``requested()`` is what the loop polls."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}
        self._handed_over = False

    def install(self) -> PreemptionWatch:
        """Handle the preemption signals (main thread only; elsewhere this is a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in preemption_signals():
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is None:
            self.signal = signum

    def requested(self) -> bool:
        return self.signal is not None

    def restore(self) -> None:
        """Put the earlier handlers back (``hand_over`` can still call them)."""
        if threading.current_thread() is threading.main_thread():
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)

    def release(self) -> None:
        """Restore the earlier handlers; a signal that was noted but not acted on (it came
        after the last step, e.g. while a failure was being recorded) is then delivered to
        them, so it is deferred, never lost. SIGTERM's default then ends the process."""
        pending = None if self._handed_over else self.signal
        self.restore()
        if pending is not None and threading.current_thread() is threading.main_thread():
            self._handed_over = True
            signal.raise_signal(pending)

    def hand_over(self) -> None:
        """Restore the earlier handlers and call the one of the signal received, if it is a
        function (submitit's checkpoint-and-requeue); it may exit the process."""
        previous: Callable | Any = self._previous.get(self.signal) if self.signal else None
        self._handed_over = True
        self.restore()
        if callable(previous):
            previous(self.signal, None)
