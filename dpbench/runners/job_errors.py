"""A job's one-line errors: ``PROGRAM: error: ...`` on stderr, the exit codes, and the failed
record a sweep's job leaves (``results.json``, status ``failed``)."""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig

from dpbench.errors import DPBenchError
from dpbench.logging.records import failed_record, write_record


def print_error(message: str, program: str = "dpbench") -> None:
    """Print ``message`` as the one line ``PROGRAM: error: ...`` (inner newlines joined)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    print(f"{program}: error: {' / '.join(lines)}", file=sys.stderr)


def fail(message: str, code: int = 2) -> None:
    """Print the one-line error and exit with ``code``."""
    print_error(message)
    sys.exit(code)


def os_error(err: OSError, fallback: Path, doing: str = "") -> str:
    """Return '[DOING ]PATH: REASON' for a failed file operation."""
    return f"{doing}{err.filename or fallback}: {err.strerror or err}"


def error_message(err: BaseException) -> str:
    """Return a dpbench error's own message, or any other error's type and message."""
    return str(err) if isinstance(err, DPBenchError) else f"{type(err).__name__}: {err}"


class Stop(Exception):  # noqa: N818 - not an error: the job ends before training, quietly
    """Raised from ``ready`` when the job ends before its first step; ``code`` is the exit."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def report_error(cfg: DictConfig, run_dir: Path, err: BaseException, stage: str,
                 keep_record: bool) -> None:
    """Print ``err`` as the one-line error; with ``keep_record`` also write the failed record
    (``stage``: setup or train) into ``run_dir``."""
    message = (os_error(err, run_dir) if isinstance(err, OSError) and err.strerror
               and not isinstance(err, DPBenchError) else error_message(err))
    if keep_record:
        try:
            write_record(run_dir, failed_record(cfg, err, stage))
        except OSError as write_err:  # e.g. the disk is full: say so on the same line
            message += f" (and results.json could not be written: {write_err.strerror})"
    print_error(message)

