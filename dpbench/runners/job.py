"""The job wrapper every command shares: the run folder's lock and checks, the one-line
errors, ``config.yaml``, ``run.log`` and the record (``results.json``), around one
``experiment.run(spec)``.

- ``run_job(cfg)``: one job of ``dpbench`` (a run, one job of a ``-m`` sweep, or every rank of
  a ``torchrun`` job: rank 0 alone locks, writes and logs, and tells the others whether to
  train with ``StartSignal``; they never write a file).
- ``train_in(cfg, run_dir)``: one ``dpbench-tune`` trial or final run, in this process.
- ``run_locked(program, cfg, check_kind, work)``: the frame of ``dpbench-audit`` and
  ``dpbench-mia`` (their ``work`` builds its runs from a ``RunSpec`` too).

A bad setting prints one line ``PROGRAM: error: ...``, exits 2 before any training and removes
only the folders the job created; in a sweep a failing job writes a ``failed`` record and the
others go on. A scheduler's preemption signal stops the run at a step boundary with its
checkpoint saved (exit 3, or submitit's requeue). See docs/distributed.md.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from dpbench.errors import ConfigError, DataError, DPBenchError
from dpbench.logging.records import COMPLETED, RESULTS_NAME, failed_record, write_record
from dpbench.training.distributed import (
    Collective,
    close_collective,
    from_slurm_tasks,
    init_collective,
)
from dpbench.training.preemption import PREEMPTED_EXIT_CODE, Preempted, PreemptionWatch
from dpbench.utils.io import atomic_write_bytes, open_append, remove_created, take_created
from dpbench.utils.lock import RunDirLock
from dpbench.utils.paths import check_run_dir
from dpbench.utils.threads import apply_threads, torch_threads

if TYPE_CHECKING:
    from dpbench.spec import RunSpec

log = logging.getLogger("dpbench")


def print_error(message: str, program: str = "dpbench") -> None:
    """Print ``message`` as the one line ``PROGRAM: error: ...`` (inner newlines joined)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    print(f"{program}: error: {' / '.join(lines)}", file=sys.stderr)


def fail(message: str, code: int = 2) -> None:
    """Print the one-line error and exit with ``code``."""
    print_error(message)
    sys.exit(code)


def _os_error(err: OSError, fallback: Path, doing: str = "") -> str:
    """Return '[DOING ]PATH: REASON' for a failed file operation."""
    return f"{doing}{err.filename or fallback}: {err.strerror or err}"


def _message(err: BaseException) -> str:
    return str(err) if isinstance(err, DPBenchError) else f"{type(err).__name__}: {err}"


class _Stop(Exception):  # noqa: N818 - not an error: the job ends before training, quietly
    """Raised from ``ready`` when the job ends before its first step; ``code`` is the exit."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _callbacks(cfg: DictConfig, run_dir: Path, sweep_name: str | None) -> list:
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


def _report_error(cfg: DictConfig, run_dir: Path, err: BaseException, stage: str,
                  keep_record: bool) -> None:
    message = (_os_error(err, run_dir) if isinstance(err, OSError) and err.strerror
               and not isinstance(err, DPBenchError) else _message(err))
    if keep_record:
        try:
            write_record(run_dir, failed_record(cfg, err, stage))
        except OSError as write_err:  # e.g. the disk is full: say so on the same line
            message += f" (and results.json could not be written: {write_err.strerror})"
    print_error(message)


def completed_record(spec: RunSpec, results: Path) -> dict | None:
    """Return the run dir's completed record if it was written by this very config.

    Raise ConfigError if another config wrote it (resuming would hand back its results), if
    its MAC does not verify with this user's key, or if its epsilon is not the one its own
    mechanism gives (``privacy.record_check.check_record_epsilon``).
    """
    from dpbench.privacy.record_check import LedgerMismatch, check_record_epsilon
    from dpbench.spec import fingerprint
    from dpbench.utils.mac import verify_mac
    from dpbench.utils.safe_json import UnsafeFile, parse_json, read_bytes

    try:
        data = read_bytes(results)
        record = parse_json(data, results)
    except (OSError, UnsafeFile) as err:
        raise ConfigError(f"{results} cannot be read ({err}); move it away to start afresh"
                          ) from None
    if not isinstance(record, dict) or record.get("status") != COMPLETED:
        return None
    verify_mac(results, data, "the completed record")
    if fingerprint(OmegaConf.create(record.get("config") or {})) != spec.fingerprint:
        raise ConfigError(f"{results} was written by another configuration; resume with the "
                          "same settings or use a new hydra.run.dir")
    try:
        check_record_epsilon(record, str(results))
    except LedgerMismatch as err:
        raise ConfigError(f"{err}; move it away to start afresh") from None
    return record


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
                        else _os_error(err, run_dir, "cannot write into hydra.run.dir: "))
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
            raise _Stop(0 if code == StartSignal.DONE else 2)
        watch.install()
        training = True

    try:
        spec = build_spec(cfg)
        apply_threads(spec.trainer.num_threads, hc)
        return run(spec, None, [], collective=collective, ready=ready, stop=watch.requested)
    except _Stop as stop:
        if multirun:
            return None
        sys.exit(stop.code)
    except Preempted:
        watch.hand_over()
        sys.exit(PREEMPTED_EXIT_CODE)
    except Exception as err:  # noqa: BLE001 - rank 0 reports a bad setting; this is the rest
        print_error(prefix + _message(err))
        if multirun and not training:
            return None
        sys.exit(1 if training else 2)
    finally:
        watch.release()


def _open_run_files(cfg: DictConfig, run_dir: Path) -> logging.Handler:
    """Write ``config.yaml`` and open ``run.log``; on OSError say so in one line (a config.yaml
    this call created is removed) and raise ``_Stop(2)``: nothing trained yet."""
    config_path = run_dir / "config.yaml"
    had_config = config_path.exists()
    try:
        atomic_write_bytes(config_path, OmegaConf.to_yaml(cfg, resolve=True).encode())
        handler = logging.StreamHandler(open_append(run_dir / "run.log"))  # no link followed
    except OSError as err:  # read-only or full output folder
        print_error(_os_error(err, run_dir, "cannot write "))
        if not had_config:
            config_path.unlink(missing_ok=True)
        raise _Stop(2) from err
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s"))
    return handler


def _resume(trainer: Any) -> None:
    """Load the run dir's checkpoint when resuming; any failure to read it is one DataError."""
    try:
        trainer.maybe_resume()
    except DPBenchError:
        raise
    except Exception as err:  # noqa: BLE001 - torch.load raises many kinds on a bad file
        raise DataError(f"cannot resume from {trainer.checkpoint_path}: the checkpoint is "
                        f"unreadable, corrupt or truncated ({type(err).__name__}: {err}); "
                        "move it away to start afresh") from err


def _run_locked(cfg: DictConfig, hc: Any, run_dir: Path, multirun: bool,
                undo: Callable[[], Any], collective: Collective | None = None,
                start: StartSignal | None = None) -> dict | None:
    """run_job's body, with the run dir locked; ``undo()`` removes what a refusal created."""
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
            _report_error(cfg, run_dir, err, "setup", multirun and not existed_before)
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
        callbacks = _callbacks(cfg, run_dir, Path(hc.sweep.dir).name if multirun else None)
    except expected as err:
        return refuse(err)
    watch = PreemptionWatch()
    handler: logging.Handler | None = None
    training = False

    def ready(trainer: Any) -> None:
        nonlocal handler, training
        _resume(trainer)  # a checkpoint of another config fails here, writing nothing
        handler = _open_run_files(cfg, run_dir)
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

    try:
        result = run(spec, run_dir, callbacks, collective=collective, ready=ready,
                     stop=watch.requested)
    except _Stop:
        return refuse(None)
    except Preempted as err:  # a whole step checkpointed: not a failure
        _preempted(callbacks, err, watch)
    except BaseException as err:  # noqa: BLE001 - record every failure, then re-raise
        if not training:
            if isinstance(err, expected):
                return refuse(err)
            raise
        for cb in callbacks:
            if hasattr(cb, "close"):
                cb.close(failed=True)
        _report_error(cfg, run_dir, err, "train", keep_record=True)
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
    _print_done(cfg, result, run_dir)
    return result


def _print_done(cfg: DictConfig, result: dict, run_dir: Path) -> None:
    from dpbench.privacy.samplers import RELATION_LABEL

    eps = result["epsilon"]
    acc = result["metrics"].get("accuracy")
    print(f"dpbench: {cfg.method.name} on {cfg.dataset.name}/{cfg.model.name}: "
          f"epsilon {eps if math.isinf(eps) else round(eps, 4)} (target "
          f"{result['target_epsilon']}, delta {result['delta']}, "
          f"{RELATION_LABEL.get(result.get('neighbouring'), 'add/remove')}"
          + (f", per user ({result['user_level']['strategy']}, k="
             f"{result['user_level']['max_examples_per_user']})"
             if result.get("privacy_unit") == "user" else "") + "), "
          + (f"test accuracy {acc:.4f}, " if acc is not None else "")
          + f"results in {run_dir / RESULTS_NAME}")


def _preempted(callbacks: list, err: Preempted, watch: PreemptionWatch) -> None:
    """Say where the run stopped, close the sinks, hand over to the earlier handler (submitit
    requeues) or exit 3; the checkpoint stays, and no failed record is written."""
    for cb in callbacks:
        if hasattr(cb, "close"):
            cb.close(failed=False)
    print(f"dpbench: {err}", file=sys.stderr)
    watch.hand_over()
    sys.exit(PREEMPTED_EXIT_CODE)


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
        print_error(_message(err), program)
        lock.release()
        remove_if_fresh(run_dir, existed)
        sys.exit(2)
    finally:
        lock.release()
