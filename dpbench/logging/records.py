"""The fields of a run's ``results.json`` known without training, and the atomic write.

Light on purpose (no torch): the command line writes a failed run's record with these before
any training module is imported (docs/engine.md, start-up).
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

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


def _tuning_record(cfg: DictConfig) -> dict[str, Any]:
    """Return how the run's hyper-parameters were chosen (the search ledger left out)."""
    tuning = cfg.get("tuning")
    if tuning is None:
        return {"mode": "default"}
    out = OmegaConf.to_container(tuning, resolve=True)
    out.pop("search_ledger", None)
    return out


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
        "evaluation": OmegaConf.to_container(cfg.get("evaluation") or {"split": "test"},
                                             resolve=True),
        "tuning": _tuning_record(cfg),
        "config": OmegaConf.to_container(cfg, resolve=True),
        "git_commit": git_commit(),
    }


def failed_record(cfg: DictConfig, error: BaseException, stage: str) -> dict[str, Any]:
    """Return a record for a run that failed (the report lists it as failed, not missing)."""
    return {**base_record(cfg), "epsilon": None, "delta": None, "noise_multiplier": None,
            "sample_rate": None, "steps": None, "accountant": None, "metrics": {},
            "wall_time_s": None, "status": "failed", "error": f"{type(error).__name__}: {error}",
            "failed_stage": stage}


def write_record(run_dir: Path, record: dict[str, Any]) -> Path:
    path = Path(run_dir) / RESULTS_NAME
    atomic_write_json(path, record)
    return path
