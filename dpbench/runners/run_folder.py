"""The run folder a job writes into: what it may hold before the job starts (a run of the
same kind, inside outputs/ unless the user chose it), and the first files the job writes there
(``config.yaml`` and ``run.log``) once its settings are valid."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from dpbench.errors import ConfigError
from dpbench.logging.records import RESULTS_NAME
from dpbench.runners.job_errors import Stop, os_error, print_error
from dpbench.utils.io import atomic_write_bytes, open_append
from dpbench.utils.paths import check_run_dir

#: the program that writes each ``kind`` of record (a training record has none)
RECORD_KINDS = {"audit": "dpbench-audit", "mia": "dpbench-mia"}


def check_folder_kind(run_dir: Path) -> None:
    """Raise ConfigError if ``run_dir`` holds a record of another kind than a training run's
    (``kind`` set: an audit's, a membership-inference run's, or one unknown): a run folder
    holds one kind of record, and a training run never replaces another's."""
    from dpbench.utils.safe_json import UnsafeFile, read_json

    results = run_dir / RESULTS_NAME
    if not results.exists():
        return
    try:
        record = read_json(results)
    except (UnsafeFile, OSError):
        return  # an unreadable record is the run's own to replace (as before)
    kind = record.get("kind") if isinstance(record, dict) else None
    if kind is not None and kind != "training":
        program = RECORD_KINDS.get(kind) if isinstance(kind, str) else None
        raise ConfigError(f"hydra.run.dir={run_dir} holds a "
                          f"{program + ' run' if program else f'record of kind {kind!r}'} "
                          f"({RESULTS_NAME}); a training run writes only into an empty folder "
                          "or a training run's: choose another folder")


def check_folder(run_dir: Path, hydra_overrides: list[str],
                 check_kind: Callable[[Path], None]) -> None:
    """Raise ConfigError if the run folder lies outside outputs/ without the user choosing it
    (``check_run_dir``) or holds a run of another kind (``check_kind``)."""
    check_run_dir(run_dir, hydra_overrides)
    check_kind(run_dir)


def open_run_files(cfg: DictConfig, run_dir: Path) -> logging.Handler:
    """Write ``config.yaml`` and open ``run.log``; on OSError say so in one line (a config.yaml
    this call created is removed) and raise ``Stop(2)``: nothing trained yet."""
    config_path = run_dir / "config.yaml"
    had_config = config_path.exists()
    try:
        atomic_write_bytes(config_path, OmegaConf.to_yaml(cfg, resolve=True).encode())
        handler = logging.StreamHandler(open_append(run_dir / "run.log"))  # no link followed
    except OSError as err:  # read-only or full output folder
        print_error(os_error(err, run_dir, "cannot write "))
        if not had_config:
            config_path.unlink(missing_ok=True)
        raise Stop(2) from err
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s"))
    return handler
