"""A ``-m seed=...`` sweep with ``trainer.seeds_at_once=K``: its seeds trained K at a time.

Hydra's basic launcher runs a sweep's jobs one after the other in this process, each in its
own run folder. With ``seeds_at_once=K > 1`` each job (``enlist``, called through
``grouped_job`` by the ``dpbench`` entry in place of ``runners.job.run_job``)
does everything a job does before its first step, for its own folder: the lock, the one pass
of checks (``spec.build_spec``), the folder's checks, a completed record handed back under
``trainer.resume=true``, the grouping's own refusals, its Trainer built as a separate run of
its seed would be (``experiment.build``), its checkpoint resumed, ``config.yaml`` and
``run.log``. The job then waits in a group of its cell (every setting but the seed equal).
When K jobs of a cell are waiting, or the sweep ends (``flush``, from the sweep's end
callback), the group trains in lockstep (``training/seed_group.py``): each seed's records,
checkpoint and ``results.json`` land in its own folder through its own callbacks, exactly as
a separate run's. A bad setting fails that seed alone (a ``failed`` record, one line), as in
any sweep; a failure during the group's training fails each seed of the group; a
preemption checkpoints every seed of the group at the same step (exit 3), and
``trainer.resume=true`` resumes the group from there.

Only the basic launcher runs the jobs in one process: another launcher is refused in one
line, as are W&B sinks (one W&B run per process here).
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dpbench.errors import ConfigError, DPBenchError
from dpbench.logging.records import RESULTS_NAME
from dpbench.runners.job import close_sinks, resume_trainer, run_callbacks
from dpbench.runners.job_errors import Stop, print_error, report_error
from dpbench.runners.job_record import completed_record, print_done
from dpbench.runners.run_folder import check_folder, check_folder_kind, open_run_files
from dpbench.training.preemption import PREEMPTED_EXIT_CODE, Preempted, PreemptionWatch
from dpbench.utils.io import remove_created
from dpbench.utils.lock import RunDirLock
from dpbench.utils.threads import apply_threads

log = logging.getLogger("dpbench")

#: the launcher whose jobs run one after the other in this process
BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"


@dataclass
class Member:
    """One seed's job, ready to train: its folder (locked), config, Trainer and sinks."""

    cfg: DictConfig
    run_dir: Path
    trainer: Any
    callbacks: list
    lock: RunDirLock
    handler: logging.Handler


#: the cells' waiting jobs, in sweep order
_WAITING: dict[str, list[Member]] = {}


def cell_key(cfg: DictConfig) -> str:
    """Return what the seeds of one group share: every setting but the seed, the run's name
    and where it writes (Hydra's keys, ``paths``, the logger)."""
    from dpbench.spec import settings_of

    data = settings_of(cfg, "seed", "run_name", "hydra", "paths", "logger")
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def grouping_check(cfg: DictConfig, hc: Any, spec: Any) -> None:
    """Raise ConfigError (one line) if this job's seed cannot train in a group."""
    from dpbench.training.seed_group import spec_refusal

    launcher = str(OmegaConf.select(hc, "launcher._target_") or "")
    if launcher != BASIC_LAUNCHER:
        raise ConfigError(f"trainer.seeds_at_once={spec.trainer.seeds_at_once} groups the jobs "
                          f"of Hydra's basic launcher, not of {launcher or 'this launcher'}: "
                          "set trainer.seeds_at_once=1")
    if cfg.get("logger") is not None and cfg.logger.get("_target_"):
        raise ConfigError(f"trainer.seeds_at_once={spec.trainer.seeds_at_once} trains several "
                          "runs in one process, W&B one: use logger=none (results.json holds "
                          "every metric)")
    reason = spec_refusal(spec)
    if reason is not None:
        raise ConfigError(reason)


def grouped_job(cfg: DictConfig) -> bool:
    """Handle one job of a sweep with ``trainer.seeds_at_once != 1`` (``enlist``) and return
    True; return False for any other job (``run_job`` runs it)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from dpbench.utils.io import take_created

    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN or cfg.trainer.get("seeds_at_once", 1) == 1:
        return False
    run_dir = Path(hc.runtime.output_dir)
    enlist(cfg, hc, run_dir, take_created(run_dir))
    return True


def enlist(cfg: DictConfig, hc: Any, run_dir: Path, created: list[Path]) -> dict | None:
    """Prepare one seed's job of a sweep and add it to its cell's group (module doc); train
    the group once it holds ``trainer.seeds_at_once`` seeds. Return a completed record handed
    back, else None (the record is written when the group trains)."""
    from dpbench.experiment import build
    from dpbench.logging.progress import ProgressBar
    from dpbench.spec import build_spec

    lock = RunDirLock(run_dir)
    try:
        lock.acquire()
    except (DPBenchError, OSError) as err:
        print_error(str(err) if isinstance(err, DPBenchError)
                    else f"cannot write into hydra.run.dir: {err.filename or run_dir}: "
                         f"{err.strerror or err}")
        remove_created(created)
        return None
    existed_before = (run_dir / RESULTS_NAME).exists() or (run_dir / "checkpoint.pt").exists()
    handler = None
    try:
        spec = build_spec(cfg)
        cfg = spec.cfg
        check_folder(run_dir, list(hc.overrides.hydra), check_folder_kind)
        grouping_check(cfg, hc, spec)
        if spec.trainer.resume and (run_dir / RESULTS_NAME).exists():
            record = completed_record(spec, run_dir / RESULTS_NAME)
            if record is not None:
                print(f"dpbench: {run_dir} already completed; epsilon {record['epsilon']}")
                lock.release()
                return record
        apply_threads(spec.trainer.num_threads, hc)
        callbacks = run_callbacks(cfg, run_dir, Path(hc.sweep.dir).name)
        if any(m for members in _WAITING.values() for m in members):
            # one progress bar for the group: its first seed's
            callbacks = [cb for cb in callbacks if not isinstance(cb, ProgressBar)]
        trainer = build(spec, run_dir, callbacks)
        if trainer.data.task != "classification":
            raise ConfigError(f"trainer.seeds_at_once supports classification, not a "
                              f"{trainer.data.task} task")
        resume_trainer(trainer)
        handler = open_run_files(cfg, run_dir)
        _log_to(handler, "N=%d q=%.4g steps=%d sigma=%.4g delta=%s accountant=%s; trained "
                "with the other seeds of its cell, %d at once (trainer.seeds_at_once)",
                len(trainer.data.train), trainer.plan.sample_rate, trainer.plan.total_steps,
                trainer.plan.noise_multiplier, trainer.plan.delta, trainer.plan.accountant,
                spec.trainer.seeds_at_once)
    except Stop:
        lock.release()
        return None
    except Exception as err:  # noqa: BLE001 - a sweep records every failure, the others go on
        report_error(cfg, run_dir, err, "setup", not existed_before)
        lock.release()
        if isinstance(err, KeyboardInterrupt):
            raise
        return None
    key = cell_key(cfg)
    members = _WAITING.setdefault(key, [])
    members.append(Member(cfg, run_dir, trainer, callbacks, lock, handler))
    if len(members) >= spec.trainer.seeds_at_once:
        train_group(_WAITING.pop(key))
    return None


def flush() -> None:
    """Train every group still waiting (the sweep has ended)."""
    while _WAITING:
        train_group(_WAITING.pop(next(iter(_WAITING))))


def _log_to(handler: logging.Handler, message: str, *args: Any) -> None:
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        log.info(message, *args)
    finally:
        root.removeHandler(handler)


def _fail(member: Member, err: BaseException, stage: str) -> None:
    close_sinks(member.callbacks, failed=True)
    report_error(member.cfg, member.run_dir, err, stage, keep_record=True)


def _release(member: Member) -> None:
    member.handler.close()
    stream = getattr(member.handler, "stream", None)
    if stream is not None:
        stream.close()
    member.lock.release()


def checked_group(members: list[Member]) -> tuple[list[Member], Any]:
    """Return the members whose group engine passed the per-run check, and their group; a
    seed whose check fails is refused alone (a failed record, one line)."""
    from dpbench.training.seed_group import SeedGroup

    while True:
        group = SeedGroup([m.trainer.model for m in members])
        failed = []
        for k, member in enumerate(members):
            try:
                member.trainer.use_engine(group.member(k), "grouped")
            except ConfigError as err:
                failed.append(member)
                _fail(member, err, "setup")
                _release(member)
        if not failed:
            return members, group
        members = [m for m in members if m not in failed]
        if not members:
            return [], None


def train_group(members: list[Member]) -> None:
    """Train ``members`` (seeds of one cell) together; write each one's record."""
    from dpbench.training.seed_group import fit_group

    members, group = checked_group(members)
    if not members:
        return
    watch = PreemptionWatch()
    watch.install()
    try:
        results = fit_group([m.trainer for m in members], group, stop=watch.requested)
    except Preempted as err:
        for member in members:
            close_sinks(member.callbacks, failed=False)
        print(f"dpbench: {err} (every seed of its group: {len(members)})", file=sys.stderr)
        watch.hand_over()
        sys.exit(PREEMPTED_EXIT_CODE)
    except BaseException as err:  # noqa: BLE001 - each seed records the failure
        for member in members:
            _fail(member, err, "train")
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        return
    finally:
        watch.release()
        for member in members:
            _release(member)
    for member, result in zip(members, results):
        print_done(member.cfg, result, member.run_dir)
