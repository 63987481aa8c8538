"""Stop a command cleanly on Ctrl-C or a scheduler's signal, and its children with it.

``dpbench`` itself stops at a step boundary with its checkpoint saved (``training.preemption``).
Commands that drive other work (``dpbench-mia`` trains several models, ``dpbench-reproduce``
runs sweeps as child processes) stop as a whole instead: ``stop_on_signals`` turns SIGINT,
SIGTERM and the other preemption signals into ``Stopped`` in the main thread, the command
prints one line (``PROGRAM: preempted by SIGTERM; ...``) and exits with ``dpbench``'s
preemption code (3). ``run_child`` starts a child in a process group of its own and, when
the parent is stopped, sends the group SIGTERM (a ``dpbench`` sweep then checkpoints each
run), waits a grace period, then SIGKILL: nothing it started outlives it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from dpbench.training.preemption import PREEMPTED_EXIT_CODE, preemption_signals

__all__ = ["PREEMPTED_EXIT_CODE", "Stopped", "run_child", "stop_on_signals"]

#: seconds a stopped child group has to checkpoint before it is killed
GRACE_S = 60.0


class Stopped(BaseException):  # noqa: N818 - like KeyboardInterrupt: not an error of the work
    """The command was asked to stop by ``signum`` (SIGINT, SIGTERM, ...)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def _raise(signum: int, frame: Any) -> None:
    raise Stopped(signum)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Raise ``Stopped`` in the main thread on SIGINT or a preemption signal while the block
    runs; the earlier handlers are restored after it (elsewhere than the main thread: no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = [signal.SIGINT, *preemption_signals()]
    previous = {sig: signal.signal(sig, _raise) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_child(cmd: Sequence[str], grace_s: float = GRACE_S, **popen: Any) -> int:
    """Run ``cmd`` in a process group of its own and return its exit code; if this process is
    stopped meanwhile (any exception, ``Stopped`` included), the group gets SIGTERM, then
    SIGKILL after ``grace_s`` seconds, and the exception goes on."""
    proc = subprocess.Popen(list(cmd), start_new_session=True, **popen)
    try:
        return proc.wait()
    except BaseException:
        # a second signal while the children checkpoint must not leave them behind
        with _ignoring_signals():
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc.pid, signal.SIGKILL)  # what the child left (e.g. its workers)
            proc.wait()
        raise


@contextmanager
def _ignoring_signals() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = [signal.SIGINT, *preemption_signals()]
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
