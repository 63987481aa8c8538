"""An exclusive lock on a run directory, so two runs never write the same results.

The lock is ``fcntl.flock`` on ``<run dir>/.dpbench.lock``: the kernel drops it when the holding
process exits or is killed, so a lock file left by a dead process is stale and is simply taken
over. The file records the holder's PID for the message a second run prints.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from dpbench.errors import DPBenchError

LOCK_NAME = ".dpbench.lock"


class RunDirBusy(DPBenchError):
    """Another live process holds the run directory's lock."""


class RunDirLock:
    """``with RunDirLock(run_dir):`` holds the run directory for this process."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> RunDirLock:
        """Take the lock; raise RunDirBusy if another process holds it (OSError if unwritable)."""
        while True:
            try:  # never through a link: a planted link would truncate its target
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as err:
                if os.path.islink(self.path):
                    raise RunDirBusy(f"{self.path} is a symbolic link, not a dpbench lock; "
                                     "remove it or choose another folder") from err
                raise
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise RunDirBusy(f"{self.path.parent} is in use by another dpbench run "
                                 f"(pid {holder}); wait for it to finish or choose another "
                                 "hydra.run.dir") from None
            except BaseException:
                os.close(fd)
                raise
            # the holder we waited on may have removed the file: lock the file on disk, not
            # an unlinked one
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent)."""
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
