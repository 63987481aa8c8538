"""A job's record: the completed record a resumed run hands back (checked: same config, its
MAC, its epsilon), and the one line a finished run prints."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf

from dpbench.errors import ConfigError
from dpbench.logging.records import COMPLETED, RESULTS_NAME

if TYPE_CHECKING:
    from dpbench.spec import RunSpec


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


def print_done(cfg: DictConfig, result: dict, run_dir: Path) -> None:
    """Print the one line of a finished run: its epsilon, its accuracy, where its record is."""
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
