"""An exclusive lock on a run directory, so two runs never write the same results.

The lock is ``filelock``'s native Unix lock (``flock``) on ``<run dir>/.dpbench.lock``: the
kernel drops it when the holding process exits or is killed, so a lock file left by a dead
process is stale and is simply taken over. filelock opens the file with ``O_NOFOLLOW``, so a
planted link is never followed (it would truncate its target); such a link is refused by name.
The file records the holder's PID for the message a second run prints, and is removed on
release.
"""

from __future__ import annotations

import os
from pathlib import Path

from filelock import Timeout, UnixFileLock

from dpbench.errors import DPBenchError

LOCK_NAME = ".dpbench.lock"


class RunDirBusy(DPBenchError):
    """Another live process holds the run directory's lock."""


class RunDirLock:
    """``with RunDirLock(run_dir):`` holds the run directory for this process."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self._lock: UnixFileLock | None = None
        self._inode: tuple[int, int] | None = None

    def _record_pid(self, fd: int) -> None:
        """Write this process's PID into the lock file (filelock's ``on_acquired``)."""
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        st = os.fstat(fd)
        self._inode = (st.st_dev, st.st_ino)

    def _holder(self) -> str:
        """Return the PID the holder recorded ("?" if unreadable), never through a link."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return "?"
        try:
            return os.read(fd, 32).decode(errors="replace").strip() or "?"
        finally:
            os.close(fd)

    def acquire(self) -> RunDirLock:
        """Take the lock; raise RunDirBusy if another process holds it (OSError if unwritable)."""
        lock = UnixFileLock(self.path, blocking=False, thread_local=False,
                            fallback_to_soft=False, on_acquired=self._record_pid)
        try:
            for _ in range(3):  # a holder that removed its file meanwhile: lock the one on disk
                try:
                    lock.acquire()
                    break
                except Timeout:
                    if os.path.lexists(self.path):
                        raise
            else:
                raise Timeout(str(self.path))
        except Timeout:
            raise RunDirBusy(f"{self.path.parent} is in use by another dpbench run "
                             f"(pid {self._holder()}); wait for it to finish or choose another "
                             "hydra.run.dir") from None
        except OSError as err:
            if os.path.islink(self.path):
                raise RunDirBusy(f"{self.path} is a symbolic link, not a dpbench lock; "
                                 "remove it or choose another folder") from err
            raise
        self._lock = lock
        return self

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent)."""
        if self._lock is None:
            return
        try:  # remove only the file this process locked (never a file put in its place)
            st = os.lstat(self.path)
            if (st.st_dev, st.st_ino) == self._inode:
                self.path.unlink()
        except FileNotFoundError:
            pass
        finally:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
