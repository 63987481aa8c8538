"""What the launcher told this process, read from the environment without importing torch
(the command line reads it before deciding whether it needs torch at all)."""

from __future__ import annotations

import os

from dpbench.errors import ConfigError

__all__ = ["launched_world_size"]


def launched_world_size() -> int:
    """Return WORLD_SIZE of a torchrun-style launch (1 when not launched that way)."""
    value = os.environ.get("WORLD_SIZE", "1")
    try:
        return max(int(value), 1)
    except ValueError:
        raise ConfigError(f"the environment variable WORLD_SIZE must be an integer "
                          f"(got {value!r})") from None
