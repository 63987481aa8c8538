"""The local results store: one atomic ``results.json`` per run, read back by the report."""

from __future__ import annotations

import functools
import math
import subprocess
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dpbench.training.loop import Callback, Trainer
from dpbench.utils.io import atomic_write_json

RESULTS_NAME = "results.json"


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """Return the commit of the dpbench checkout (``unknown`` outside git)."""
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=5, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=5).stdout
        return out.stdout.strip() + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def base_record(cfg: DictConfig) -> dict[str, Any]:
    """Return the fields every record carries, known before the run starts."""
    method = cfg.method.name
    private_cfg = bool(cfg.privacy.get("enabled", True))
    return {
        "method": method if private_cfg or method == "nonprivate" else "nonprivate",
        "method_name": method,
        "dataset": cfg.dataset.name,
        "model": cfg.model.name,
        "privacy": cfg.privacy.name,
        "seed": cfg.get("seed"),  # validated as an int before training; as given if refused
        "run_name": cfg.get("run_name"),
        "target_epsilon": cfg.privacy.get("target_epsilon"),
        "config": OmegaConf.to_container(cfg, resolve=True),
        "git_commit": git_commit(),
    }


def failed_record(cfg: DictConfig, error: BaseException, stage: str) -> dict[str, Any]:
    """Return a record for a run that failed (the report lists it as failed, not missing)."""
    return {**base_record(cfg), "epsilon": None, "delta": None, "noise_multiplier": None,
            "sample_rate": None, "steps": None, "accountant": None, "metrics": {},
            "wall_time_s": None, "status": "failed", "error": f"{type(error).__name__}: {error}",
            "failed_stage": stage}


def run_record(cfg: DictConfig, summary: dict[str, Any], status: str) -> dict[str, Any]:
    record = {**base_record(cfg), **summary, "status": status}
    if not summary.get("private", True):
        record["method"] = "nonprivate"
        record["epsilon"] = math.inf
    return record


def write_record(run_dir: Path, record: dict[str, Any]) -> Path:
    path = Path(run_dir) / RESULTS_NAME
    atomic_write_json(path, record)
    return path


class ResultsStore(Callback):
    """Writes results.json after every epoch (status ``running``) and at the end."""

    def __init__(self, cfg: DictConfig, run_dir: Path) -> None:
        self.cfg, self.run_dir = cfg, Path(run_dir)

    def on_epoch_end(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        if trainer.epoch < trainer.settings.epochs:
            write_record(self.run_dir, run_record(self.cfg, trainer.summary(), "running"))

    def on_run_end(self, trainer: Trainer, result: dict[str, Any]) -> None:
        write_record(self.run_dir, run_record(self.cfg, result, "completed"))
