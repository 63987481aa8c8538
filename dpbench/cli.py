"""``dpbench``: one Hydra entry point for single runs and ``-m`` sweeps.

A single run with a bad setting prints one clear line, exits 2 and leaves nothing in outputs/.
In a sweep, a failing job writes a ``failed`` results.json and the others go on.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from dpbench.config.schema import register_schemas
from dpbench.errors import DPBenchError
from dpbench.logging.results import RESULTS_NAME, failed_record, write_record
from dpbench.tune.choices import apply_tuned
from dpbench.utils.io import atomic_write_bytes

log = logging.getLogger("dpbench")
CONF_DIR = os.environ.get("DPBENCH_CONFIG_DIR",
                          str(Path(__file__).resolve().parent.parent / "conf"))
register_schemas()


def _remove_if_fresh(run_dir: Path, existed_before: bool) -> None:
    """Delete a run dir this invocation created and left empty (nothing half-written)."""
    if existed_before or not run_dir.exists() or any(run_dir.iterdir()):
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    parent = run_dir.parent
    while parent.name and parent.name != "outputs" and parent.exists() and not any(
            parent.iterdir()):
        parent.rmdir()
        parent = parent.parent


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

        group = cfg.logger.get("group") or (
            Path(HydraConfig.get().sweep.dir).name if multirun else None)
        callbacks.append(instantiate(cfg.logger, group=group, run_dir=run_dir, cfg=cfg,
                                     name=cfg.get("run_name")))
    return callbacks


def _report_error(cfg: DictConfig, run_dir: Path, err: BaseException, stage: str,
                  multirun: bool, keep_record: bool) -> None:
    message = f"{type(err).__name__}: {err}" if not isinstance(err, DPBenchError) else str(err)
    print(f"dpbench: error: {message}", file=sys.stderr)
    if keep_record or multirun:
        write_record(run_dir, failed_record(cfg, err, stage))


def _completed_record(cfg: DictConfig, results: Path) -> dict | None:
    """Return the run dir's completed record if it was written by this very config.

    Raise ConfigError if another config wrote it (resuming would hand back its results).
    """
    import json

    from dpbench.errors import ConfigError
    from dpbench.experiment import fingerprint

    record = json.loads(results.read_text())
    if record.get("status") != "completed":
        return None
    if fingerprint(OmegaConf.create(record.get("config") or {})) != fingerprint(cfg):
        raise ConfigError(f"{results} was written by another configuration; resume with the "
                          "same settings or use a new hydra.run.dir")
    return record


def run_job(cfg: DictConfig) -> dict | None:
    """Validate, train and record one job of a run or sweep."""
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    existed_before = (run_dir / RESULTS_NAME).exists() or (run_dir / "checkpoint.pt").exists()
    from dpbench.experiment import build_trainer

    results = run_dir / RESULTS_NAME
    # in a sweep every failure is recorded and the other jobs go on
    expected = Exception if multirun else (DPBenchError, TypeError, ValueError, ImportError,
                                           OSError)
    try:
        cfg = apply_tuned(cfg)  # tuned=FILE: this cell's stored dpbench-tune choice
        if cfg.trainer.get("resume") and results.exists():
            record = _completed_record(cfg, results)
            if record is not None:
                print(f"dpbench: {run_dir} already completed; epsilon {record['epsilon']}")
                return record
        callbacks = _callbacks(cfg, run_dir, multirun)
        trainer = build_trainer(cfg, run_dir, callbacks)
        trainer.maybe_resume()  # a checkpoint of another config fails here, writing nothing
    except expected as err:
        # a failed record never replaces the record of an earlier run in the same dir
        _report_error(cfg, run_dir, err, "setup", multirun and not existed_before,
                      keep_record=False)
        if multirun:
            return None
        _remove_if_fresh(run_dir, existed_before)
        sys.exit(2)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True).encode())
    handler = logging.FileHandler(run_dir / "run.log")
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        for note in trainer.data.notes:
            log.warning(note)
        log.info("N=%d q=%.4g steps=%d sigma=%.4g delta=%s accountant=%s",
                 len(trainer.data.train), trainer.plan.sample_rate, trainer.plan.total_steps,
                 trainer.plan.noise_multiplier, trainer.plan.delta, trainer.plan.accountant)
        result = trainer.fit()
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
        logging.getLogger().removeHandler(handler)
        handler.close()
    eps = result["epsilon"]
    acc = result["metrics"].get("accuracy")
    print(f"dpbench: {cfg.method.name} on {cfg.dataset.name}/{cfg.model.name}: "
          f"epsilon {eps if math.isinf(eps) else round(eps, 4)} (target "
          f"{result['target_epsilon']}, delta {result['delta']}), "
          + (f"test accuracy {acc:.4f}, " if acc is not None else "")
          + f"results in {run_dir / RESULTS_NAME}")
    return result


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _hydra_entry(cfg: DictConfig) -> None:
    run_job(cfg)


def main() -> None:
    """Console script ``dpbench`` (and ``python -m dpbench``)."""
    _hydra_entry()


if __name__ == "__main__":
    main()
