"""``dpbench``: one Hydra entry point for single runs and ``-m`` sweeps.

The Hydra entry and the run folder's creation live here; the job itself (the lock, the one
pass of checks into a ``RunSpec``, ``run(spec)``, ``config.yaml``, ``run.log`` and the record)
is ``runners.job.run_job``, shared with the other commands. A single run with a bad setting
prints one clear line, exits 2 and leaves nothing in outputs/: it removes only the folders it
created itself. A run holds a lock on its run directory, so a second run on the same directory
is refused. In a sweep, a failing job writes a ``failed`` results.json and the others go on.

Under ``torchrun --nproc_per_node=K`` every rank runs this job; rank 0 alone locks, writes
and logs, and tells the others whether to train; they never write a file. A scheduler's
preemption signal stops the run at a step boundary with its checkpoint saved (exit 3, or
submitit's requeue). See docs/distributed.md.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback as HydraCallback
from omegaconf import DictConfig, OmegaConf

from dpbench.config.entry import check_command_line, hydra_entry
from dpbench.errors import ConfigError
from dpbench.runners.job_errors import fail
from dpbench.utils.io import make_dirs, record_created, remove_created
from dpbench.utils.launch import launched_world_size


def _make_dirs(path: Path, key: str) -> list[Path]:
    """Create ``path`` and missing parents; return those created, top first (exit 2 on error)."""
    try:
        return make_dirs(path)
    except OSError as err:
        fail(f"cannot create {key}={path}: {err.strerror or err} ({err.filename or path})")


class RunDirGuard(HydraCallback):
    """Create the run (or sweep) folder before Hydra does, recording what did not exist.

    An output folder that cannot be created or written is reported in one line (exit 2)
    instead of Hydra's traceback.
    """

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        run_dir = Path(os.path.abspath(str(OmegaConf.select(config, "hydra.run.dir"))))
        # Hydra creates the run dir before the job starts, so the folders are recorded
        # here first; a refused run removes only these (utils.io.take_created)
        record_created(run_dir, _make_dirs(run_dir, "hydra.run.dir"))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(os.path.abspath(str(OmegaConf.select(config, "hydra.sweep.dir"))))
        created = _make_dirs(sweep_dir, "hydra.sweep.dir")
        # a sweep refused before its first job removes only these (config.compose_once)
        record_created(sweep_dir, created)
        try:
            with tempfile.TemporaryFile(dir=sweep_dir):
                pass
        except OSError as err:
            remove_created(created)
            fail(f"cannot write into hydra.sweep.dir={sweep_dir}: {err.strerror or err}")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        # trainer.seeds_at_once: the groups of seeds still waiting train now
        from dpbench.runners.seed_groups import flush

        flush()


@hydra_entry("config")
def hydra_main(cfg: DictConfig) -> None:
    # imported when a job runs: --help and --cfg print without importing torch
    from dpbench.runners.job import run_job
    from dpbench.runners.seed_groups import grouped_job

    if grouped_job(cfg):  # trainer.seeds_at_once in a sweep: the seeds train in groups
        return
    run_job(cfg)


def main() -> None:
    """Console script ``dpbench`` (and ``python -m dpbench``)."""
    try:
        world = launched_world_size()
    except ConfigError as err:
        fail(str(err))
    if world > 1 and any(a in ("-m", "--multirun") for a in sys.argv[1:]):
        fail("torchrun trains one run across its processes, not a sweep: sweep with a "
             "launcher whose jobs have K tasks (hydra/launcher=submitit_slurm "
             "hydra.launcher.tasks_per_node=K; docs/distributed.md)")
    check_command_line("config", "dpbench", __name__)
    hydra_main()


if __name__ == "__main__":
    main()
