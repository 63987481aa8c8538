"""Run a Hydra entry point in-process, as the console script would (argv, exit code)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from hydra.core.global_hydra import GlobalHydra

QUIET_CLI = ("logger=none", "trainer.progress=false", "trainer.device=cpu")


def run_cli(entry: Callable[[], None], args: list[str], monkeypatch,
            quiet: tuple[str, ...] = QUIET_CLI) -> int:
    """Return the exit code of ``entry`` run with ``args`` (0 when it returns normally)."""
    flags = [a for a in args if a.startswith("-")]  # e.g. -m: before the overrides
    overrides = [a for a in args if not a.startswith("-")]
    # no logging reconfiguration in-process: handlers bound to a test's captured stderr
    # outlive it and crash the session ("lost sys.stderr"); errors are printed, not logged
    no_logging = ["hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    monkeypatch.setattr(sys, "argv", ["dpbench", *flags, *no_logging, *quiet, *overrides])
    GlobalHydra.instance().clear()
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    try:
        entry()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        GlobalHydra.instance().clear()
        # Hydra's job logging binds a handler to this test's (captured) stderr: drop it, or a
        # later test logs into a closed stream
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    return 0
