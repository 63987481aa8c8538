"""Read a JSON file someone else may have written: bounded in size and depth, regular files only.

A path in a shared folder can be a FIFO (reading blocks forever), a device (``/dev/zero``
never ends), a file of gigabytes, or JSON nested so deeply that parsing exhausts the stack.
``read_json`` refuses each of these with one line naming the file, before parsing.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import numpy as np

from dpbench.errors import DataError

MAX_BYTES = 64 * 2**20
MAX_DEPTH = 64
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


class UnsafeFile(DataError):
    """A file that is not a regular file, too large, too deeply nested or not JSON."""


def json_depth(data: bytes) -> int:
    """Return the deepest nesting of ``[``/``{`` in JSON text (string contents ignored)."""
    brackets = np.frombuffer(_STRINGS.sub(b'""', data), dtype=np.uint8)
    step = np.zeros(len(brackets), dtype=np.int64)
    step[(brackets == ord("[")) | (brackets == ord("{"))] = 1
    step[(brackets == ord("]")) | (brackets == ord("}"))] = -1
    return int(np.cumsum(step).max(initial=0))


def read_bytes(path: str | os.PathLike, max_bytes: int = MAX_BYTES,
               follow_links: bool = True) -> bytes:
    """Return the bytes of the regular file ``path`` (at most ``max_bytes``); UnsafeFile else.

    Opened without blocking and checked with ``fstat`` on the open descriptor, so a FIFO or a
    device swapped in after a check is still refused; FileNotFoundError passes through.
    ``follow_links=False``: a symbolic link in place of ``path`` is refused (OSError ELOOP).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow_links else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFile(f"{path} is not a regular file")
        if info.st_size > max_bytes:
            raise UnsafeFile(f"{path} is {info.st_size} bytes, more than the {max_bytes} "
                             "allowed")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise UnsafeFile(f"{path} grew past the {max_bytes} bytes allowed while being read")
    return data


def read_json(path: str | os.PathLike, max_bytes: int = MAX_BYTES,
              max_depth: int = MAX_DEPTH) -> Any:
    """Return the parsed JSON of ``path``, bounded as the module docstring says."""
    return parse_json(read_bytes(path, max_bytes), path, max_depth)


def parse_json(data: bytes, path: str | os.PathLike, max_depth: int = MAX_DEPTH) -> Any:
    """Return the parsed JSON of ``data`` (read from ``path``: bytes a caller also needs, e.g.
    to check their MAC); UnsafeFile if it nests deeper than ``max_depth`` or is not JSON."""
    depth = json_depth(data)
    if depth > max_depth:
        raise UnsafeFile(f"{path} nests JSON {depth} levels deep (at most {max_depth})")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise UnsafeFile(f"{Path(path)} is not JSON ({type(err).__name__}: {err})") from err
