"""``dpbench-audit``: train once with gradient canaries; epsilon_lower vs epsilon_claimed.

Config-driven like ``dpbench`` (``conf/audit.yaml`` = ``conf/config.yaml`` + ``conf/audit``):
``dpbench-audit method=dpsgd privacy=eps1 audit.canaries=1000``, sweeps with ``-m``. The run
writes ``results.json`` (status ``completed``, ``epsilon_claimed``, ``epsilon_lower``,
``audit_power`` and the ``audit`` block) and prints one table row with the power next to
epsilon_lower. Bad settings exit 2 and leave nothing behind.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from dpbench.config.entry import check_command_line, hydra_entry
from dpbench.errors import ConfigError
from dpbench.logging.records import COMPLETED, run_record, write_record
from dpbench.privacy.samplers import RELATION_LABEL
from dpbench.runners.locked import run_locked

if TYPE_CHECKING:  # the run's modules (torch, Opacus) are imported when an audit runs
    from dpbench.audit.canaries import AuditSettings
    from dpbench.spec import RunSpec

HEADER = ("| method | dataset | epsilon_claimed | epsilon_lower | power | ceiling "
          "| epsilon_lower (f-DP) | ceiling (f-DP) | correct / guesses | canaries "
          "| claimed under |")


def audit_settings(cfg: DictConfig) -> AuditSettings:
    from dpbench.audit.canaries import AuditSettings

    node = OmegaConf.to_container(cfg.get("audit") or {}, resolve=True)
    try:
        return AuditSettings(**node)
    except TypeError as err:
        raise ConfigError(f"audit: {err}") from err


def audit_run(spec: RunSpec, run_dir: Path | None = None) -> dict[str, Any]:
    """Train the run of ``spec`` with canaries (``experiment.run`` with the audit's
    ``CanaryRun``) and (if ``run_dir``) write results.json; return it."""
    from dpbench.audit.canaries import CanaryRun
    from dpbench.experiment import run

    canary_run = CanaryRun(audit_settings(spec.cfg))
    summary = canary_run.outcome(run(spec, make_trainer=canary_run))
    record = {**run_record(spec.cfg, summary, COMPLETED), "kind": "audit"}
    if run_dir is not None:
        write_record(run_dir, record)
    return record


def run_audit(cfg: DictConfig, run_dir: Path | None = None) -> dict[str, Any]:
    """Validate a composed config (``build_spec``), then ``audit_run``; return the record."""
    from dpbench.spec import build_spec

    return audit_run(build_spec(cfg), run_dir)


def table_row(record: dict[str, Any]) -> str:
    a = record["audit"]
    claimed = record["epsilon_claimed"]
    return (f"| {record['method']} | {record['dataset']} | "
            f"{claimed if math.isinf(claimed) else round(claimed, 3)} | "
            f"{round(a['epsilon_lower'], 3)} | {round(a['power'], 3)} | "
            f"{_num(a.get('ceiling'))} | {_num(a.get('epsilon_lower_fdp'))} | "
            f"{_num(a.get('ceiling_fdp'))} | {a['correct']} / {a['guesses']} | {a['canaries']} | "
            f"{RELATION_LABEL.get(record.get('neighbouring'), 'add/remove')} |")


def _num(value: float | None) -> str:
    return "" if value is None else str(round(value, 3))


def audit_messages(record: dict[str, Any]) -> list[str]:
    """Return the notes and warnings an audit's record calls for (stderr lines).

    A note when the claim lies above a bound's ceiling (the highest epsilon_lower any
    attack reaches at this size: no violation above it is detectable); a WARNING naming both
    figures when a measured bound exceeds the claim.
    """
    a, claimed = record["audit"], record["epsilon_claimed"]
    out = []
    if a["power"] <= claimed:
        out.append(f"dpbench-audit: note: the audit's power is {a['power']:.3g}: it cannot "
                   f"detect a mechanism leaking more than that (the claim is {claimed:.3g}); "
                   "add canaries and guesses, or a smaller privacy.delta")
    for name, ceiling in (("epsilon_lower", a.get("ceiling")),
                          ("epsilon_lower_fdp", a.get("ceiling_fdp"))):
        if ceiling is not None and ceiling <= claimed:
            out.append(f"dpbench-audit: note: {name} cannot exceed {ceiling:.3g} with "
                       f"{a['canaries']} canaries and {a['guesses']} guesses: this measurement "
                       f"cannot detect a violation above {ceiling:.3g} (the claim is "
                       f"{claimed:.3g})")
    for name in a.get("exceeds_claimed", ["epsilon_lower"] if record["epsilon_lower"] > claimed
                      else []):
        out.append(f"dpbench-audit: WARNING {name} = {a[name]:.4g} exceeds the claimed epsilon "
                   f"{claimed:.4g}: the mechanism that ran is less private than accounted")
    return out


#: files a training run (``dpbench``) leaves in its folder; an audit never writes them
_TRAINING_FILES = ("config.yaml", "checkpoint.pt", "run.log")


def check_audit_folder(run_dir: Path) -> None:
    """Raise ConfigError if ``run_dir`` holds another kind of run than an audit.

    An audit writes only ``results.json`` (``kind: audit``); it must never replace a
    training run's record or sit among its files.
    """
    from dpbench.logging.records import RESULTS_NAME
    from dpbench.utils.safe_json import UnsafeFile, read_json

    found = [name for name in _TRAINING_FILES if (run_dir / name).exists()]
    results = run_dir / RESULTS_NAME
    if results.exists() or results.is_symlink():
        try:
            record = read_json(results)
        except (UnsafeFile, OSError) as err:
            raise ConfigError(f"hydra.run.dir={run_dir} holds a {RESULTS_NAME} that is not an "
                              f"audit's ({err}); choose another folder") from err
        if not isinstance(record, dict) or record.get("kind") != "audit":
            found.append(RESULTS_NAME)
    if found:
        raise ConfigError(f"hydra.run.dir={run_dir} holds another kind of run ({', '.join(found)}"
                          "); an audit writes only into an empty folder or an earlier audit's")


@hydra_entry("audit")
def hydra_main(cfg: DictConfig) -> None:
    record = run_locked("dpbench-audit", cfg, check_audit_folder, audit_run)
    print(HEADER)
    print(table_row(record))
    for line in audit_messages(record):
        print(line, file=sys.stderr)


def main() -> None:
    """Console script ``dpbench-audit`` (and ``python -m dpbench.audit``)."""
    check_command_line("audit", "dpbench-audit", __name__)
    hydra_main()


if __name__ == "__main__":
    main()
