"""The fields of a run's ``results.json`` known without training, and the atomic write.

Light on purpose (no torch): the command line writes a failed run's record with these before
any training module is imported (docs/engine.md, start-up).
"""

from __future__ import annotations

import functools
import importlib.metadata
import math
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dpbench.privacy.composition import composed_relation
from dpbench.privacy.selection import search_and_run_epsilon
from dpbench.utils.io import json_bytes
from dpbench.utils.mac import write_authenticated

RESULTS_NAME = "results.json"

#: a record's ``status``: written after every epoch, at the end, or when the run failed
RUNNING, COMPLETED, FAILED = "running", "completed", "failed"

#: the key of a record's un-noised training diagnostics (not covered by epsilon), and the
#: name records written before the rename used; readers take either (``unprivatised``)
UNPRIVATISED_DIAGNOSTICS = "unprivatised_diagnostics"
OLD_DIAGNOSTICS_KEY = "private_diagnostics"
DIAGNOSTICS_KEYS = (UNPRIVATISED_DIAGNOSTICS, OLD_DIAGNOSTICS_KEY)


def unprivatised(record: dict[str, Any]) -> dict[str, Any] | None:
    """Return the record's un-noised training diagnostics under the new key or, for a record
    written before the rename, the old one; None when it has neither."""
    for key in DIAGNOSTICS_KEYS:
        if isinstance(record.get(key), dict):
            return record[key]
    return None


#: the libraries whose versions change a run's numbers, by distribution name
VERSIONED = {"torch": "torch", "opacus": "opacus", "dp_accounting": "dp-accounting",
             "numpy": "numpy"}


@functools.lru_cache(maxsize=1)
def _git_state() -> tuple[str, bool | None]:
    """Return (commit, whether tracked files differ from it); ("unknown", None) outside git."""
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=5, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=5).stdout
        return out.stdout.strip(), bool(dirty.strip())
    except (OSError, subprocess.SubprocessError):
        return "unknown", None


def git_commit() -> str:
    """Return the commit of the dpbench checkout (``unknown`` outside git), ``-dirty`` added
    when tracked files differ from it."""
    commit, dirty = _git_state()
    return commit + ("-dirty" if dirty else "")


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def _cpu_name() -> str:
    """Return the processor's model name (Linux's /proc/cpuinfo, else the platform's word)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _torch_environment(device: str | None) -> dict[str, Any]:
    """Return the device, thread count and CPU kernel set, if torch is already imported.

    torch is not imported here: a run refused before training writes its record without it
    (these fields are then null).
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return {"device": None, "device_name": None, "torch_threads": None,
                "cpu_capability": None}
    name = device or "cpu"
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device_name = _cpu_name()
    if name.startswith("cuda") and torch.cuda.is_available():
        device_name = torch.cuda.get_device_name(torch.device(name))
    return {"device": name, "device_name": device_name,
            "torch_threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def environment(device: str | None = None) -> dict[str, Any]:
    """Return what a run's numbers depend on besides its config: library versions, the device,
    torch's threads, the CPU kernel set (``ATEN_CPU_CAPABILITY``), a dirty working tree."""
    commit, dirty = _git_state()
    return {"python": platform.python_version(),
            **{key: _version(dist) for key, dist in VERSIONED.items()},
            "platform": platform.platform(), "cpu": _cpu_name(),
            **_torch_environment(device),
            "aten_cpu_capability_env": os.environ.get("ATEN_CPU_CAPABILITY"),
            "git_commit": commit, "git_dirty": dirty}


def _tuning_record(cfg: DictConfig) -> dict[str, Any]:
    """Return how the run's hyper-parameters were chosen, the search's ledger included (a
    reader re-derives ``total_epsilon`` from it, ``privacy.record_check.check_record_epsilon``)."""
    tuning = cfg.get("tuning")
    if tuning is None:
        return {"mode": "default"}
    return OmegaConf.to_container(tuning, resolve=True)


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
        "environment": environment(cfg.get("trainer", {}).get("device")),
    }


def run_record(cfg: DictConfig, summary: dict[str, Any], status: str,
               base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Return the record of a run: ``base`` (``base_record(cfg)``, computed if not given),
    the trainer's summary and the status. (Here rather than beside ``ResultsStore``, so the
    commands that write a record import no training loop to start.)"""
    record = {**(base_record(cfg) if base is None else base), **summary, "status": status}
    record["tuning"] = dict(record["tuning"])  # a shared ``base`` is never modified
    tuning = cfg.get("tuning")
    if tuning is not None and tuning.get("mode") == "accounted" and summary.get("private"):
        record["tuning"]["total_epsilon"] = search_and_run_epsilon(
            list(tuning.get("search_ledger") or []),
            float(tuning.get("selection_epsilon") or 0.0), summary["privacy_ledger"],
            summary["epsilon"], summary["delta"], summary["accountant"])
        # the relation the total holds under (the search's and the run's, composed)
        record["tuning"]["total_epsilon_neighbouring"] = composed_relation(
            [list(tuning.get("search_ledger") or []), summary["privacy_ledger"]])
    if not summary.get("private", True):
        record["method"] = "nonprivate"
        record["epsilon"] = math.inf
    return record


def failed_record(cfg: DictConfig, error: BaseException, stage: str) -> dict[str, Any]:
    """Return a record for a run that failed (the report lists it as failed, not missing)."""
    return {**base_record(cfg), "epsilon": None, "delta": None, "noise_multiplier": None,
            "sample_rate": None, "steps": None, "accountant": None, "metrics": {},
            "wall_time_s": None, "status": FAILED, "error": f"{type(error).__name__}: {error}",
            "failed_stage": stage}


def write_record(run_dir: Path, record: dict[str, Any], durable: bool = True) -> Path:
    """Write ``results.json`` atomically with its MAC (``results.json.mac``, utils/mac.py);
    ``durable=False`` for a record the run replaces later (``utils.io.atomic_write_bytes``)."""
    path = Path(run_dir) / RESULTS_NAME
    write_authenticated(path, json_bytes(record), durable=durable)
    return path
