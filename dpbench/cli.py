"""``dpbench``: one Hydra entry point for single runs and ``-m`` sweeps.

A single run with a bad setting prints one clear line, exits 2 and leaves nothing in outputs/:
it removes only the folders it created itself. A run holds a lock on its run directory, so a
second run on the same directory is refused. In a sweep, a failing job writes a ``failed``
results.json and the others go on.

Under ``torchrun --nproc_per_node=K`` every rank runs this job; rank 0 alone locks, writes
and logs, and tells the others whether to train (``StartSignal``); they never write a file.
A scheduler's preemption signal stops the run at a step boundary with its checkpoint saved
(exit 3, or submitit's requeue). See docs/distributed.md.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback as HydraCallback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from dpbench.config.entry import check_command_line, hydra_entry
from dpbench.config.schema import TrainerConfig, check_seed
from dpbench.errors import ConfigError, DataError, DPBenchError
from dpbench.logging.finished import completed_record
from dpbench.logging.records import RESULTS_NAME, failed_record, write_record
from dpbench.training.distributed import (
    Collective,
    close_collective,
    from_slurm_tasks,
    init_collective,
    launched_world_size,
)
from dpbench.training.preemption import PREEMPTED_EXIT_CODE, Preempted, PreemptionWatch
from dpbench.tune.choices import apply_tuned
from dpbench.utils.io import (
    atomic_write_bytes,
    make_dirs,
    open_append,
    record_created,
    remove_created,
    take_created,
)
from dpbench.utils.lock import RunDirLock
from dpbench.utils.paths import check_path_values, check_run_dir
from dpbench.utils.threads import apply_threads, torch_threads

log = logging.getLogger("dpbench")

def _print_error(message: str) -> None:
    """Print ``message`` as the one line ``dpbench: error: ...`` (inner newlines joined)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    print(f"dpbench: error: {' / '.join(lines)}", file=sys.stderr)


def _fail(message: str, code: int = 2) -> None:
    _print_error(message)
    sys.exit(code)


def _os_error(err: OSError, fallback: Path, doing: str = "") -> str:
    """Return '[DOING ]PATH: REASON' for a failed file operation."""
    return f"{doing}{err.filename or fallback}: {err.strerror or err}"


def _make_dirs(path: Path, key: str) -> list[Path]:
    """Create ``path`` and missing parents; return those created, top first (exit 2 on error)."""
    try:
        return make_dirs(path)
    except OSError as err:
        _fail(f"cannot create {key}={path}: {err.strerror or err} ({err.filename or path})")


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
        try:
            with tempfile.TemporaryFile(dir=sweep_dir):
                pass
        except OSError as err:
            remove_created(created)
            _fail(f"cannot write into hydra.sweep.dir={sweep_dir}: {err.strerror or err}")


def _callbacks(cfg: DictConfig, run_dir: Path, multirun: bool):
    from dpbench.logging.progress import ProgressBar
    from dpbench.logging.reliability import ReliabilityDiagram
    from dpbench.logging.results import ResultsStore

    callbacks = [ResultsStore(cfg, run_dir),
                 ReliabilityDiagram(run_dir, cfg.get("run_name") or "")]
    if cfg.trainer.get("progress", True):
        callbacks.append(ProgressBar())
    if cfg.get("logger") is not None and cfg.logger.get("_target_"):
        from hydra.utils import instantiate

        from dpbench.config.targets import check_targets

        check_targets(cfg.logger, "logger")
        group = cfg.logger.get("group") or (
            Path(HydraConfig.get().sweep.dir).name if multirun else None)
        callbacks.append(instantiate(cfg.logger, group=group, run_dir=run_dir, cfg=cfg,
                                     name=cfg.get("run_name")))
    return callbacks


#: characters W&B refuses in a project name (it fails only after the run is set up)
_WANDB_FORBIDDEN = "/\\#?%:"


def check_logger(cfg: DictConfig) -> None:
    """Raise ConfigError naming the key if a logger setting would fail after set-up."""
    logger = cfg.get("logger")
    if logger is None:
        return
    for key in ("project", "entity", "group"):
        value = logger.get(key)
        if value is not None and any(c in str(value) for c in _WANDB_FORBIDDEN):
            raise ConfigError(f"logger.{key}={value!r} may not contain any of "
                              f"{' '.join(_WANDB_FORBIDDEN)}")


def check_trainer(cfg: DictConfig) -> None:
    """Raise ConfigError naming the key if a ``trainer.*`` setting is out of range."""
    node = OmegaConf.to_container(cfg.trainer, resolve=True)
    try:
        TrainerConfig(**node)
    except TypeError as err:
        raise ConfigError(f"trainer: {err}") from err


def check_folder_kind(run_dir: Path) -> None:
    """Raise ConfigError if ``run_dir`` holds a ``dpbench-audit`` run (a training run never
    replaces an audit's record)."""
    from dpbench.utils.safe_json import UnsafeFile, read_json

    results = run_dir / RESULTS_NAME
    if not results.exists():
        return
    try:
        record = read_json(results)
    except (UnsafeFile, OSError):
        return  # an unreadable record is the run's own to replace (as before)
    if isinstance(record, dict) and record.get("kind") == "audit":
        raise ConfigError(f"hydra.run.dir={run_dir} holds a dpbench-audit run; choose another "
                          "folder")


def _report_error(cfg: DictConfig, run_dir: Path, err: BaseException, stage: str,
                  multirun: bool, keep_record: bool) -> None:
    if isinstance(err, DPBenchError):
        message = str(err)
    elif isinstance(err, OSError) and err.strerror:
        message = _os_error(err, run_dir)
    else:
        message = f"{type(err).__name__}: {err}"
    if keep_record or multirun:
        try:
            write_record(run_dir, failed_record(cfg, err, stage))
        except OSError as write_err:  # e.g. the disk is full: say so on the same line
            message += f" (and results.json could not be written: {write_err.strerror})"
    _print_error(message)


class StartSignal:
    """Rank 0 tells the other ranks, once, whether to train: GO, DONE (already completed) or
    REFUSED (it stopped before training and said why). A no-op in a 1-process run."""

    GO, DONE, REFUSED = 0, 1, 2

    def __init__(self, collective: Collective) -> None:
        self.collective, self.sent = collective, False

    def send(self, code: int) -> None:
        if self.sent or not self.collective.distributed:
            return
        self.sent = True
        self.collective.bytes_from_main(bytes([code]))

    def receive(self) -> int:
        return self.collective.bytes_from_main(b"")[0]


def run_job(cfg: DictConfig) -> dict | None:
    """Lock the run dir, then validate, train and record one job of a run or sweep."""
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    created = take_created(run_dir)
    try:
        from_slurm_tasks()  # a SLURM job with K tasks: torchrun's variables from submitit
        collective = init_collective(str(cfg.trainer.get("device", "auto")))
    except (DPBenchError, RuntimeError, ValueError) as err:
        _print_error(f"cannot join the process group: {err}")
        remove_created(created)
        if multirun:
            return None
        sys.exit(2)
    try:
        if not collective.is_main:
            return _run_worker(cfg, run_dir, multirun, collective, created)
        return _run_main(cfg, run_dir, multirun, collective, created)
    finally:
        close_collective(collective)


def _run_main(cfg: DictConfig, run_dir: Path, multirun: bool, collective: Collective,
              created: list[Path]) -> dict | None:
    """Rank 0 (or the only process): lock the run dir, then validate, train and record."""
    start = StartSignal(collective)
    lock = RunDirLock(run_dir)
    try:
        try:
            lock.acquire()
        except (DPBenchError, OSError) as err:
            _print_error(str(err) if isinstance(err, DPBenchError)
                         else _os_error(err, run_dir, "cannot write into hydra.run.dir: "))
            remove_created(created)
            if multirun:
                return None
            sys.exit(2)
        try:
            return _run_locked(cfg, run_dir, multirun, lambda: (lock.release(),
                                                                remove_created(created)),
                               collective, start)
        finally:
            lock.release()
    finally:
        start.send(StartSignal.REFUSED)  # if it has not said GO or DONE: the others stop


def _run_worker(cfg: DictConfig, run_dir: Path, multirun: bool, collective: Collective,
                created: list[Path]) -> dict | None:
    """Rank r > 0: build the same trainer, wait for rank 0's word, train; write nothing."""
    from dpbench.experiment import build_trainer

    prefix = f"rank {collective.rank}: "
    start = StartSignal(collective)
    try:
        check_seed(cfg.get("seed"))
        check_path_values(cfg)
        cfg = apply_tuned(cfg)
        check_trainer(cfg)
        apply_threads(cfg.trainer.get("num_threads"), HydraConfig.get())
        trainer = build_trainer(cfg, None, [], collective=collective)
    except Exception as err:  # noqa: BLE001 - rank 0 reports a bad setting; this is the rest
        _print_error(prefix + (str(err) if isinstance(err, DPBenchError)
                               else f"{type(err).__name__}: {err}"))
        if multirun:
            return None
        sys.exit(2)
    code = start.receive()
    if code != StartSignal.GO:
        if code == StartSignal.REFUSED:
            remove_created(created)  # rank 0 said why; what this rank made goes
        if multirun:
            return None
        sys.exit(0 if code == StartSignal.DONE else 2)
    # the watch stays installed until the failure is reported: a launcher's SIGTERM (torchrun
    # stops the other ranks when one dies) must not cut the one-line report short
    watch = PreemptionWatch().install()
    try:
        return trainer.fit(stop=watch.requested)
    except Preempted:
        watch.hand_over()
        sys.exit(PREEMPTED_EXIT_CODE)
    except Exception as err:  # noqa: BLE001 - one line, then the rank stops
        _print_error(prefix + (str(err) if isinstance(err, DPBenchError)
                               else f"{type(err).__name__}: {err}"))
        sys.exit(1)
    finally:
        watch.release()


def _run_locked(cfg: DictConfig, run_dir: Path, multirun: bool, undo,
                collective: Collective | None = None,
                start: StartSignal | None = None) -> dict | None:
    """run_job's body, with the run dir locked; ``undo()`` removes what a refusal created."""
    hc = HydraConfig.get()
    existed_before = (run_dir / RESULTS_NAME).exists() or (run_dir / "checkpoint.pt").exists()
    from dpbench.experiment import build_trainer

    results = run_dir / RESULTS_NAME
    # in a sweep every failure is recorded and the other jobs go on
    expected = Exception if multirun else (DPBenchError, TypeError, ValueError, ImportError,
                                           OSError)
    try:
        check_seed(cfg.get("seed"))  # before run_name, which is built from it
        check_path_values(cfg)
        check_logger(cfg)
        check_run_dir(run_dir, list(hc.overrides.hydra))
        check_folder_kind(run_dir)
        cfg = apply_tuned(cfg)  # tuned=FILE: this cell's stored dpbench-tune choice
        if cfg.trainer.get("resume") and results.exists():
            record = completed_record(cfg, results)
            if record is not None:
                if start is not None:
                    start.send(StartSignal.DONE)
                print(f"dpbench: {run_dir} already completed; epsilon {record['epsilon']}")
                return record
        check_trainer(cfg)  # before apply_threads: a bad thread count must not reach torch
        threads = apply_threads(cfg.trainer.get("num_threads"), hc)  # k parallel jobs share cores
        callbacks = _callbacks(cfg, run_dir, multirun)
        trainer = build_trainer(cfg, run_dir, callbacks, collective=collective)
        _resume(trainer)  # a checkpoint of another config fails here, writing nothing
    except expected as err:
        # a failed record never replaces the record of an earlier run in the same dir
        _report_error(cfg, run_dir, err, "setup", multirun and not existed_before,
                      keep_record=False)
        if multirun:
            return None
        undo()
        sys.exit(2)
    config_path = run_dir / "config.yaml"
    had_config = config_path.exists()
    try:
        atomic_write_bytes(config_path, OmegaConf.to_yaml(cfg, resolve=True).encode())
        handler = logging.StreamHandler(open_append(run_dir / "run.log"))  # no link followed
    except OSError as err:  # read-only or full output folder: nothing trained yet
        _print_error(_os_error(err, run_dir, "cannot write "))
        if not had_config:
            config_path.unlink(missing_ok=True)
        if multirun:
            return None
        undo()
        sys.exit(2)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s"))
    logging.getLogger().addHandler(handler)
    watch = PreemptionWatch()
    try:
        for note in trainer.data.notes:
            log.warning(note)
        log.info("torch threads: %d (%s; OMP_NUM_THREADS=%s)", torch_threads(),
                 "set for this job" if threads else "torch's default",
                 os.environ.get("OMP_NUM_THREADS"))
        log.info("N=%d q=%.4g steps=%d sigma=%.4g delta=%s accountant=%s",
                 len(trainer.data.train), trainer.plan.sample_rate, trainer.plan.total_steps,
                 trainer.plan.noise_multiplier, trainer.plan.delta, trainer.plan.accountant)
        if start is not None:
            start.send(StartSignal.GO)
        watch.install()  # restored only after a failure is recorded (see the finally)
        result = trainer.fit(stop=watch.requested)
    except Preempted as err:  # a whole step checkpointed: not a failure
        _preempted(callbacks, err, watch)
    except BaseException as err:  # noqa: BLE001 - record every failure, then re-raise
        for cb in callbacks:
            if hasattr(cb, "close"):
                cb.close(failed=True)
        _report_error(cfg, run_dir, err, "train", multirun, keep_record=True)
        if isinstance(err, (KeyboardInterrupt, SystemExit)) or not multirun:
            if isinstance(err, KeyboardInterrupt):
                raise
            sys.exit(1)
        return None
    finally:
        # a SIGTERM that arrives while a failure is recorded (torchrun stops every rank when
        # one dies) is delivered only now, so the record and the one-line error are complete
        watch.release()
        logging.getLogger().removeHandler(handler)
        handler.close()
        handler.stream.close()
    eps = result["epsilon"]
    acc = result["metrics"].get("accuracy")
    print(f"dpbench: {cfg.method.name} on {cfg.dataset.name}/{cfg.model.name}: "
          f"epsilon {eps if math.isinf(eps) else round(eps, 4)} (target "
          f"{result['target_epsilon']}, delta {result['delta']}), "
          + (f"test accuracy {acc:.4f}, " if acc is not None else "")
          + f"results in {run_dir / RESULTS_NAME}")
    return result


def _preempted(callbacks: list, err: Preempted, watch: PreemptionWatch) -> None:
    """Say where the run stopped, close the sinks, hand over to the earlier handler (submitit
    requeues) or exit 3; the checkpoint stays, and no failed record is written."""
    for cb in callbacks:
        if hasattr(cb, "close"):
            cb.close(failed=False)
    print(f"dpbench: {err}", file=sys.stderr)
    watch.hand_over()
    sys.exit(PREEMPTED_EXIT_CODE)


def _resume(trainer) -> None:
    """Load the run dir's checkpoint when resuming; any failure to read it is one DataError."""
    try:
        trainer.maybe_resume()
    except DPBenchError:
        raise
    except Exception as err:  # noqa: BLE001 - torch.load raises many kinds on a bad file
        raise DataError(f"cannot resume from {trainer.checkpoint_path}: the checkpoint is "
                        f"unreadable, corrupt or truncated ({type(err).__name__}: {err}); "
                        "move it away to start afresh") from err


@hydra_entry("config")
def hydra_main(cfg: DictConfig) -> None:
    run_job(cfg)


def main() -> None:
    """Console script ``dpbench`` (and ``python -m dpbench``)."""
    try:
        world = launched_world_size()
    except ConfigError as err:
        _fail(str(err))
    if world > 1 and any(a in ("-m", "--multirun") for a in sys.argv[1:]):
        _fail("torchrun trains one run across its processes, not a sweep: sweep with a "
              "launcher whose jobs have K tasks (hydra/launcher=submitit_slurm "
              "hydra.launcher.tasks_per_node=K; docs/distributed.md)")
    check_command_line("config", "dpbench", __name__)
    hydra_main()


if __name__ == "__main__":
    main()
