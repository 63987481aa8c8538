"""Run a Hydra entry point in-process, as the console script would (argv, exit code)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from hydra.core.global_hydra import GlobalHydra

QUIET_CLI = ("logger=none", "trainer.progress=false", "trainer.device=cpu")


def run_cli(entry: Callable[[], None], args: list[str], monkeypatch,
            quiet: tuple[str, ...] = QUIET_CLI) -> int:
    """Return the exit code of ``entry`` run with ``args`` (0 when it returns normally)."""
    flags = [a for a in args if a.startswith("-")]  # e.g. -m: before the overrides
    overrides = [a for a in args if not a.startswith("-")]
    monkeypatch.setattr(sys, "argv", ["dpbench", *flags, *quiet, *overrides])
    GlobalHydra.instance().clear()
    try:
        entry()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        GlobalHydra.instance().clear()
    return 0
