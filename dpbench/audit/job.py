"""The run-folder frame of ``dpbench-audit`` and ``dpbench-mia``: lock, checks, one-line errors."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from dpbench.config.schema import TrainerConfig
from dpbench.errors import DPBenchError
from dpbench.utils.io import remove_if_fresh
from dpbench.utils.paths import check_path_values, check_run_dir
from dpbench.utils.threads import apply_threads


def run_locked(program: str, cfg: DictConfig, check_folder: Callable[[Path], None],
               work: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """Return ``work(run_dir)``'s record, run in Hydra's run folder under its lock.

    The folder is locked (one run per folder, audits and training runs alike), the path values
    and the folder are checked (``check_folder``: it holds nothing of another kind), the jobs
    of a parallel sweep share the cores (``utils.threads``), then the work runs. Bad input
    prints ``PROGRAM: error: ...`` on one line, removes the folder if this job created it, and
    exits 2.
    """
    from dpbench.utils.lock import RunDirLock

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    existed = run_dir.exists() and any(run_dir.iterdir())  # Hydra creates it empty
    lock = RunDirLock(run_dir)
    try:
        lock.acquire()
        check_path_values(cfg)
        check_run_dir(run_dir, list(HydraConfig.get().overrides.hydra))
        check_folder(run_dir)
        apply_threads(TrainerConfig(**OmegaConf.to_container(cfg.trainer, resolve=True))
                      .num_threads, HydraConfig.get())  # k parallel jobs share the cores
        return work(run_dir)
    except (DPBenchError, TypeError, ValueError, ImportError, OSError) as err:
        message = str(err) if isinstance(err, DPBenchError) else f"{type(err).__name__}: {err}"
        lines = [line.strip() for line in message.splitlines() if line.strip()]
        print(f"{program}: error: {' / '.join(lines)}", file=sys.stderr)
        lock.release()
        remove_if_fresh(run_dir, existed)
        sys.exit(2)
    finally:
        lock.release()
