"""The one writer of every file a dpbench command writes: to a temporary file in the same
folder, fsync, then rename.

Files in a run folder or an ``--out`` folder may have been planted by someone with write access
to it: a write never follows a symbolic link and never opens a FIFO (``atomic_write_bytes``
renames over whatever is at the path, link or FIFO, so the link's target is untouched and
nothing blocks; ``open_append`` refuses either), so it cannot reach a file outside the folder.
Text, JSON and figures go through it too (``atomic_write_text``, ``atomic_write_json``,
``save_figure``).
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, TextIO


def atomic_write_bytes(path: str | os.PathLike, data: bytes, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see the old or the new file, never half.

    ``durable``: the data reach the disk (``fsync``, a few milliseconds) before the file
    replaces the old one, so that an operating-system crash cannot leave it empty. Without it
    the replacement is as atomic for every reader and for a killed process; leave it on for
    anything a run resumes from or hands back."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` as ``atomic_write_bytes`` does."""
    atomic_write_bytes(path, text.encode("utf-8"))


def save_figure(fig: Any, path: str | os.PathLike, **savefig: Any) -> None:
    """Write the matplotlib figure ``fig`` to ``path`` (format from its suffix) through
    ``atomic_write_bytes``: matplotlib's own ``savefig(path)`` opens the path and follows a
    planted link."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format=Path(path).suffix.lstrip(".") or "png", **savefig)
    atomic_write_bytes(path, buffer.getvalue())


def open_append(path: str | os.PathLike, truncate: bool = False) -> TextIO:
    """Open ``path`` for appending text (created 0644 if missing; emptied first if
    ``truncate``) without following a link.

    A symbolic link (raised as ELOOP), a FIFO or a device in its place is refused with an
    OSError naming the file: a log line never lands in a file outside the folder, and a FIFO
    cannot block the run.
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
    if truncate:
        flags |= os.O_TRUNC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP or os.path.islink(path):
            raise OSError(errno.ELOOP, "a symbolic link, not followed (move it away)",
                          str(path)) from None
        if err.errno == errno.ENXIO:  # a FIFO without a reader
            raise OSError(errno.ENXIO, "not a regular file", str(path)) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "a", encoding="utf-8")


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 1) == 0:
        return obj.item()
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def json_bytes(obj: Any) -> bytes:
    """Return ``obj`` as the indented JSON ``atomic_write_json`` writes (NaN becomes null)."""
    text = json.dumps(_jsonable(obj), indent=2, sort_keys=False, default=str)
    return (text + "\n").encode()


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON atomically (NaN becomes null, inf stays Infinity)."""
    atomic_write_bytes(path, json_bytes(obj))


def make_dirs(path: str | os.PathLike) -> list[Path]:
    """Create ``path`` and its missing parents; return the folders created, top first.

    A folder that another process creates meanwhile (every ``torchrun`` rank creates the same
    run folder) is used and not counted as created. On any other ``OSError`` the folders
    created so far are removed again (``remove_created``) and the error is raised: a refused
    command leaves no folder of its own behind.
    """
    missing, probe = [], Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    created: list[Path] = []
    try:
        for folder in reversed(missing):
            try:
                folder.mkdir()
            except FileExistsError:
                if folder.is_dir() and not folder.is_symlink():
                    continue  # made by a concurrent process: not ours to remove
                raise
            created.append(folder)
    except OSError:
        remove_created(created)
        raise
    return created


def remove_created(created: list[Path]) -> None:
    """Remove folders a command created (top first in ``created``), deepest first, while they
    are empty: anything another process wrote there stays, and so does every folder above."""
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:  # not empty (something else wrote there) or gone: keep the rest
            return


#: run dir (absolute) -> the folders this process created for it before its job started (the
#: command line's Hydra callback records them), so a refused job removes only those
_CREATED_FOR_RUN: dict[str, list[Path]] = {}


def _run_key(run_dir: str | os.PathLike) -> str:
    return str(Path(os.path.abspath(run_dir)))


def record_created(run_dir: str | os.PathLike, created: list[Path]) -> None:
    """Remember the folders this process created for ``run_dir`` (top first)."""
    _CREATED_FOR_RUN[_run_key(run_dir)] = created


def take_created(run_dir: str | os.PathLike) -> list[Path]:
    """Return the folders recorded for ``run_dir`` and forget them ([] if none)."""
    return _CREATED_FOR_RUN.pop(_run_key(run_dir), [])


def remove_if_fresh(run_dir: str | os.PathLike, existed_before: bool) -> None:
    """Forget the folders recorded for ``run_dir`` and, unless it held something before the
    command started, remove them (for entry points that refuse a run)."""
    created = take_created(run_dir)
    if not existed_before:
        remove_created(created)
