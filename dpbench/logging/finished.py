"""A finished run found in its folder again: resume hands back its record only when it is
this very configuration's, signed with this user's key, and its epsilon is the one its own
mechanism gives (docs/reliability.md, "Faults")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dpbench.errors import ConfigError
from dpbench.logging.records import COMPLETED


def completed_record(cfg: DictConfig, results: Path) -> dict[str, Any] | None:
    """Return the run dir's completed record if it was written by this very config.

    Raise ConfigError if another config wrote it (resuming would hand back its results), if
    its MAC does not verify with this user's key, or if its epsilon is not the one its own
    mechanism gives (``privacy.verify.check_record_epsilon``).
    """
    from dpbench.experiment import fingerprint
    from dpbench.privacy.verify import LedgerMismatch, check_record_epsilon
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
    if fingerprint(OmegaConf.create(record.get("config") or {})) != fingerprint(cfg):
        raise ConfigError(f"{results} was written by another configuration; resume with the "
                          "same settings or use a new hydra.run.dir")
    try:
        check_record_epsilon(record, str(results))
    except LedgerMismatch as err:
        raise ConfigError(f"{err}; move it away to start afresh") from None
    return record
