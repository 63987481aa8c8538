"""The job frames of the commands besides ``dpbench``: one ``dpbench-tune`` trial or final run
(``train_in``), and the locked run folder of ``dpbench-audit`` and ``dpbench-mia``
(``run_locked``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from dpbench.errors import DPBenchError
from dpbench.runners.job_errors import error_message, print_error
from dpbench.runners.run_folder import check_folder
from dpbench.utils.io import remove_created
from dpbench.utils.lock import RunDirLock
from dpbench.utils.threads import apply_threads

if TYPE_CHECKING:
    from dpbench.spec import RunSpec


def train_in(cfg: DictConfig, run_dir: Path | None = None,
             ready: Callable[[Any], None] | None = None) -> tuple[RunSpec, dict[str, Any]]:
    """Train one ``dpbench-tune`` trial or final run in this process; return its spec and
    summary (``ready(trainer)`` runs before the first step). With ``run_dir`` the folder is
    locked (one run per folder) and the run's record is written there by the same
    ``ResultsStore`` as ``dpbench``'s; a run that fails leaves no folder it created empty."""
    from dpbench.experiment import run
    from dpbench.spec import build_spec
    from dpbench.utils.io import make_dirs

    spec = build_spec(cfg)
    if run_dir is None:
        return spec, run(spec, ready=ready)
    from dpbench.logging.results import ResultsStore

    created = make_dirs(run_dir)
    lock = RunDirLock(run_dir)
    try:
        lock.acquire()
        return spec, run(spec, None, [ResultsStore(spec.cfg, run_dir)], ready=ready)
    finally:
        lock.release()
        remove_created(created)  # only if nothing was written


def run_locked(program: str, cfg: DictConfig, check_kind: Callable[[Path], None],
               work: Callable[[RunSpec, Path], dict[str, Any]]) -> dict[str, Any]:
    """Return ``work(spec, run_dir)``'s record, run in Hydra's run folder under its lock.

    The folder is locked (one run per folder, audits and training runs alike), the config is
    validated (``build_spec``) and the folder checked (``check_folder``; ``check_kind``: it
    holds nothing of another kind), the jobs of a parallel sweep share the cores
    (``utils.threads``), then the work runs. Bad input prints ``PROGRAM: error:
    ...`` on one line, removes the folder if this job created it, and exits 2.
    """
    from hydra.core.hydra_config import HydraConfig

    from dpbench.spec import build_spec
    from dpbench.utils.io import remove_if_fresh

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    existed = run_dir.exists() and any(run_dir.iterdir())  # Hydra creates it empty
    lock = RunDirLock(run_dir)
    try:
        lock.acquire()
        spec = build_spec(cfg)
        check_folder(run_dir, list(HydraConfig.get().overrides.hydra), check_kind)
        apply_threads(spec.trainer.num_threads, HydraConfig.get())  # k parallel jobs share cores
        return work(spec, run_dir)
    except (DPBenchError, TypeError, ValueError, ImportError, OSError) as err:
        print_error(error_message(err), program)
        lock.release()
        remove_if_fresh(run_dir, existed)
        sys.exit(2)
    finally:
        lock.release()
