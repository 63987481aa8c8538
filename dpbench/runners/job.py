"""The job of ``dpbench``: lock the run folder, check, train and record one run, around one
``experiment.run(spec)``.

``run_job(cfg)`` is one job of ``dpbench`` (a run, one job of a ``-m`` sweep, or every rank of
a ``torchrun`` job: rank 0 alone locks, writes and logs, and tells the others whether to
train with ``start_signal.StartSignal``; they never write a file). Its parts: the one-line
errors (``job_errors``), the run folder's checks and first files (``run_folder``), the
completed record (``job_record``); the other commands' frames are ``locked``.

A bad setting prints one line ``PROGRAM: error: ...``, exits 2 before any training and removes
only the folders the job created; in a sweep a failing job writes a ``failed`` record and the
others go on. A scheduler's preemption signal stops the run at a step boundary with its
checkpoint saved (exit 3, or submitit's requeue). See docs/distributed.md.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from dpbench.errors import DataError, DPBenchError
from dpbench.logging.records import RESULTS_NAME
from dpbench.runners.job_errors import Stop, error_message, os_error, print_error, report_error
from dpbench.runners.job_record import completed_record, print_done
from dpbench.runners.run_folder import check_folder, check_folder_kind, open_run_files
from dpbench.runners.start_signal import StartSignal
from dpbench.training.distributed import (
    Collective,
    close_collective,
    from_slurm_tasks,
    init_collective,
)
from dpbench.training.preemption import PREEMPTED_EXIT_CODE, Preempted, PreemptionWatch
from dpbench.utils.io import remove_created, take_created
from dpbench.utils.lock import RunDirLock
from dpbench.utils.threads import apply_threads, torch_threads

log = logging.getLogger("dpbench")


def run_callbacks(cfg: DictConfig, run_dir: Path, sweep_name: str | None) -> list:
    """Return the sinks of rank 0: results.json, the reliability diagram, progress, W&B."""
    from dpbench.logging.progress import ProgressBar
    from dpbench.logging.reliability import ReliabilityDiagram
    from dpbench.logging.results import ResultsStore

    callbacks = [ResultsStore(cfg, run_dir),
                 ReliabilityDiagram(run_dir, cfg.get("run_name") or "")]
    if cfg.trainer.get("progress", True):
        callbacks.append(ProgressBar())
    if cfg.get("logger") is not None and cfg.logger.get("_target_"):
        from hydra.utils import instantiate

        group = cfg.logger.get("group") or sweep_name  # checked by spec.check_logger
        callbacks.append(instantiate(cfg.logger, group=group, run_dir=run_dir, cfg=cfg,
                                     name=cfg.get("run_name")))
    return callbacks


def close_sinks(callbacks: list, failed: bool) -> None:
    """Close the sinks that hold something open (W&B), as failed or not."""
    for cb in callbacks:
        if hasattr(cb, "close"):
            cb.close(failed=failed)


def run_job(cfg: DictConfig) -> dict | None:
    """Lock the run dir, then validate, train and record one job of a run or sweep (Hydra's
    job: its run folder and mode come from ``HydraConfig``)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    created = take_created(run_dir)
    try:
        from_slurm_tasks()  # a SLURM job with K tasks: torchrun's variables from submitit
        collective = init_collective(str(cfg.trainer.get("device", "auto")))
    except (DPBenchError, RuntimeError, ValueError) as err:
        print_error(f"cannot join the process group: {err}")
        remove_created(created)
        if multirun:
            return None
        sys.exit(2)
    try:
        if not collective.is_main:
            return _run_worker(cfg, hc, multirun, collective, created)
        return _run_main(cfg, hc, run_dir, multirun, collective, created)
    finally:
        close_collective(collective)


def _run_main(cfg: DictConfig, hc: Any, run_dir: Path, multirun: bool,
              collective: Collective, created: list[Path]) -> dict | None:
    """Rank 0 (or the only process): lock the run dir, then validate, train and record."""
    start = StartSignal(collective)
    lock = RunDirLock(run_dir)
    try:
        try:
            lock.acquire()
        except (DPBenchError, OSError) as err:
            print_error(str(err) if isinstance(err, DPBenchError)
                        else os_error(err, run_dir, "cannot write into hydra.run.dir: "))
            remove_created(created)
            if multirun:
                return None
            sys.exit(2)
        try:
            return _run_locked(cfg, hc, run_dir, multirun,
                               lambda: (lock.release(), remove_created(created)),
                               collective, start)
        finally:
            lock.release()
    finally:
        start.send(StartSignal.REFUSED)  # if it has not said GO or DONE: the others stop


def _run_worker(cfg: DictConfig, hc: Any, multirun: bool, collective: Collective,
                created: list[Path]) -> dict | None:
    """Rank r > 0: build the same run, wait for rank 0's word, train; write nothing."""
    from dpbench.experiment import run
    from dpbench.spec import build_spec

    prefix = f"rank {collective.rank}: "
    start = StartSignal(collective)
    # the watch stays installed until the failure is reported: a launcher's SIGTERM (torchrun
    # stops the other ranks when one dies) must not cut the one-line report short
    watch = PreemptionWatch()
    training = False

    def ready(_trainer: Any) -> None:
        nonlocal training
        code = start.receive()
        if code != StartSignal.GO:
            if code == StartSignal.REFUSED:
                remove_created(created)  # rank 0 said why; what this rank made goes
            raise Stop(0 if code == StartSignal.DONE else 2)
        watch.install()
        training = True

    try:
        spec = build_spec(cfg)
        apply_threads(spec.trainer.num_threads, hc)
        return run(spec, None, [], collective=collective, ready=ready, stop=watch.requested)
    except Stop as stop:
        if multirun:
            return None
        sys.exit(stop.code)
    except Preempted:
        watch.hand_over()
        sys.exit(PREEMPTED_EXIT_CODE)
    except Exception as err:  # noqa: BLE001 - rank 0 reports a bad setting; this is the rest
        print_error(prefix + error_message(err))
        if multirun and not training:
            return None
        sys.exit(1 if training else 2)
    finally:
        watch.release()


def resume_trainer(trainer: Any) -> None:
    """Load the run dir's checkpoint when resuming; any failure to read it is one DataError."""
    try:
        trainer.maybe_resume()
    except DPBenchError:
        raise
    except Exception as err:  # noqa: BLE001 - torch.load raises many kinds on a bad file
        raise DataError(f"cannot resume from {trainer.checkpoint_path}: the checkpoint is "
                        f"unreadable, corrupt or truncated ({type(err).__name__}: {err}); "
                        "move it away to start afresh") from err


def _clock() -> tuple[float, float]:
    """Return the wall and CPU seconds now (``perf_counter``, ``process_time``)."""
    return time.perf_counter(), time.process_time()


def _run_locked(cfg: DictConfig, hc: Any, run_dir: Path, multirun: bool,
                undo: Callable[[], Any], collective: Collective | None = None,
                start: StartSignal | None = None) -> dict | None:
    """run_job's body, with the run dir locked; ``undo()`` removes what a refusal created."""
    began = _clock()
    from dpbench.experiment import run
    from dpbench.spec import build_spec

    existed_before = (run_dir / RESULTS_NAME).exists() or (run_dir / "checkpoint.pt").exists()
    results = run_dir / RESULTS_NAME
    # in a sweep every failure is recorded and the other jobs go on
    expected = Exception if multirun else (DPBenchError, TypeError, ValueError, ImportError,
                                           OSError)

    def refuse(err: BaseException | None) -> None:
        """A failure before training: one line (a failed record in a sweep, unless it would
        replace an earlier run's), nothing half-written left behind."""
        if err is not None:
            report_error(cfg, run_dir, err, "setup", multirun and not existed_before)
        if multirun:
            return None
        undo()
        sys.exit(2)

    try:
        spec = build_spec(cfg)
        cfg = spec.cfg
        check_folder(run_dir, list(hc.overrides.hydra), check_folder_kind)
        if spec.trainer.resume and results.exists():
            record = completed_record(spec, results)
            if record is not None:
                if start is not None:
                    start.send(StartSignal.DONE)
                from dpbench.privacy.samplers import RELATION_LABEL

                relation = RELATION_LABEL.get(record.get("neighbouring"), "add/remove")
                print(f"dpbench: {run_dir} already completed; epsilon {record['epsilon']} "
                      f"({relation})")
                return record
        threads = apply_threads(spec.trainer.num_threads, hc)  # k parallel jobs share cores
        callbacks = run_callbacks(cfg, run_dir, Path(hc.sweep.dir).name if multirun else None)
    except expected as err:
        return refuse(err)
    watch = PreemptionWatch()
    handler: logging.Handler | None = None
    training = False
    trains_from = began

    def ready(trainer: Any) -> None:
        nonlocal handler, training, trains_from
        resume_trainer(trainer)  # a checkpoint of another config fails here, writing nothing
        handler = open_run_files(cfg, run_dir)
        logging.getLogger().addHandler(handler)
        for note in trainer.data.notes:
            log.warning(note)
        log.info("torch threads: %d (%s; OMP_NUM_THREADS=%s)", torch_threads(),
                 "set for this job" if threads else "torch's default",
                 os.environ.get("OMP_NUM_THREADS"))
        plan = trainer.plan
        if plan.accountant_note:
            log.info(plan.accountant_note)
        log.info("N=%d%s q=%.4g steps=%d sigma=%.4g delta=%s accountant=%s sampler=%s "
                 "neighbouring=%s", trainer.units, f" ({plan.user.strategy} units of "
                 "privacy.unit=user)" if plan.user is not None else "", plan.sample_rate,
                 plan.total_steps,
                 plan.noise_multiplier, plan.delta, plan.accountant, plan.sampling.sampler,
                 plan.sampling.neighbouring)
        if start is not None:
            start.send(StartSignal.GO)
        watch.install()  # restored only after a failure is recorded (see the finally)
        training = True
        trains_from = _clock()

    try:
        result = run(spec, run_dir, callbacks, collective=collective, ready=ready,
                     stop=watch.requested)
        done = _clock()  # the job's own cost beside its training (docs/engine.md, "Start-up")
        log.info("trained in %.2f s (CPU %.2f s), after the job's set-up of %.2f s (CPU %.2f s)",
                 done[0] - trains_from[0], done[1] - trains_from[1],
                 trains_from[0] - began[0], trains_from[1] - began[1])
    except Stop:
        return refuse(None)
    except Preempted as err:  # a whole step checkpointed: not a failure
        _preempted(callbacks, err, watch)
    except BaseException as err:  # noqa: BLE001 - record every failure, then re-raise
        if not training:
            if isinstance(err, expected):
                return refuse(err)
            raise
        close_sinks(callbacks, failed=True)
        report_error(cfg, run_dir, err, "train", keep_record=True)
        if isinstance(err, (KeyboardInterrupt, SystemExit)) or not multirun:
            if isinstance(err, KeyboardInterrupt):
                raise
            sys.exit(1)
        return None
    finally:
        # a SIGTERM that arrives while a failure is recorded (torchrun stops every rank when
        # one dies) is delivered only now, so the record and the one-line error are complete
        watch.release()
        if handler is not None:
            logging.getLogger().removeHandler(handler)
            handler.close()
            handler.stream.close()
    print_done(cfg, result, run_dir)
    return result


def _preempted(callbacks: list, err: Preempted, watch: PreemptionWatch) -> None:
    """Say where the run stopped, close the sinks, hand over to the earlier handler (submitit
    requeues) or exit 3; the checkpoint stays, and no failed record is written."""
    close_sinks(callbacks, failed=False)
    print(f"dpbench: {err}", file=sys.stderr)
    watch.hand_over()
    sys.exit(PREEMPTED_EXIT_CODE)
