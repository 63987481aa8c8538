"""The one reader of ``results.json`` records, for every report, table, claim and curve.

``load_records(root, status=...)`` returns the records under a folder (by default the
completed ones); ``load_frame(root)`` is the same records as one row each, the unreadable
ones included. Records are read as bounded JSON (never unpickled) and checked: a file that is
not a JSON object with the fields a table needs is left out, or, where asked for, becomes an
``unreadable`` record with the reason, and the rest are still loaded. A record written before
its un-noised diagnostics were renamed (``private_diagnostics``) reads with the new key.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from dpbench.logging.records import (
    COMPLETED,
    DIAGNOSTICS_KEYS,
    OLD_DIAGNOSTICS_KEY,
    RESULTS_NAME,
    UNPRIVATISED_DIAGNOSTICS,
)
from dpbench.privacy.record_check import LedgerMismatch, check_record_epsilon
from dpbench.privacy.samplers import RELATION_LABEL
from dpbench.utils.mac import is_authentic
from dpbench.utils.safe_json import UnsafeFile, parse_json, read_bytes

#: record fields kept as columns (everything else stays in the record)
_SCALARS = ("method", "method_name", "dataset", "model", "privacy", "seed", "run_name",
            "target_epsilon", "epsilon", "delta", "noise_multiplier", "sample_rate", "steps",
            "accountant", "status", "error", "wall_time_s", "private", "grad_sample_mode",
            "tuning_mode", "tuned_lr", "total_epsilon", "evaluation_split", "sampler",
            "neighbouring", "epsilon_if_poisson", "epsilon_lower_bound",
            "epsilon_if_poisson_same_relation", "underived")


#: the status of a file the reader could not use (it is no status a run writes)
UNREADABLE = "unreadable"


class Unreadable(ValueError):
    """A results.json that cannot be reported (not JSON, not a record, wrong types)."""


#: keys every record needs, with the types they may have
_REQUIRED: dict[str, tuple[type, ...]] = {"status": (str,), "dataset": (str,),
                                          "model": (str,)}
_OPTIONAL: dict[str, tuple[type, ...]] = {
    "method": (str,), "method_name": (str,), "error": (str,), "privacy": (str,),
    "target_epsilon": (int, float, type(None)), "epsilon": (int, float, type(None)),
    "metrics": (dict, type(None)), "private": (bool, type(None)),
    "seed": (int, type(None))}


#: a measurement's numbers: (fields, lowest, highest); a record carrying one of them must give
#: a number in range (NaN refused: never dropped silently), or None where it may be absent
_RATES = ("mia_auc", "mia_auc_low", "mia_auc_high", "mia_tpr_at_0p1pct_fpr",
          "mia_tpr_at_0p1pct_fpr_low", "mia_tpr_at_0p1pct_fpr_high", "mia_tpr_at_1pct_fpr",
          "mia_tpr_at_1pct_fpr_low", "mia_tpr_at_1pct_fpr_high", "mia_balanced_accuracy")
_BOUNDS = ("mia_epsilon_lower", "mia_epsilon_point", "mia_epsilon_ceiling", "epsilon_lower",
           "epsilon_lower_fdp", "audit_power", "audit_ceiling", "audit_ceiling_fdp",
           "epsilon_claimed")
_MEASURED: dict[str, tuple[float, float]] = {**{k: (0.0, 1.0) for k in _RATES},
                                             **{k: (0.0, math.inf) for k in _BOUNDS}}
#: measured fields that may be None (no threshold gave a positive bound)
_MAY_BE_NONE = frozenset({"mia_epsilon_point", "mia_epsilon_ceiling", "epsilon_lower_fdp",
                          "audit_ceiling", "audit_ceiling_fdp"})


def _check_measured(record: dict[str, Any]) -> None:
    """Raise Unreadable naming the first measured field whose value is not a number in its
    range (AUC and TPR in [0, 1], epsilon bounds >= 0; NaN never passes)."""
    for key, (low, high) in _MEASURED.items():
        if key not in record:
            continue
        value = record[key]
        if value is None and key in _MAY_BE_NONE:
            continue
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not low <= value <= high):
            raise Unreadable(f"{key} is not a number in [{low:g}, {high:g}] "
                             f"({type(value).__name__}: {str(value)[:40]!r})")


def check_record(record: Any) -> dict[str, Any]:
    """Return ``record`` if a table can use it; raise Unreadable saying why not (a
    measurement's numbers are checked too: ``_check_measured``)."""
    if not isinstance(record, dict):
        raise Unreadable(f"expected a JSON object, got {type(record).__name__}")
    missing = [k for k in _REQUIRED if k not in record]
    if "method" not in record and "method_name" not in record:
        missing.append("method")
    if missing:
        raise Unreadable(f"missing key(s) {', '.join(missing)}")
    for key, types in {**_REQUIRED, **_OPTIONAL}.items():
        value = record.get(key)
        if key in record and (not isinstance(value, types) or (
                isinstance(value, bool) and bool not in types)):
            raise Unreadable(f"{key} has the wrong type ({type(value).__name__}: "
                             f"{str(value)[:40]!r})")
    _check_measured(record)
    if record["status"] == "failed":  # its target may be the bad input it failed on
        return record
    target, epsilon = record.get("target_epsilon"), record.get("epsilon")
    if target is not None and not (math.isfinite(target) and target > 0):
        raise Unreadable(f"target_epsilon {target!r} is not a finite number > 0")
    if epsilon is not None and not epsilon >= 0:  # NaN too
        raise Unreadable(f"epsilon {epsilon!r} is not a number >= 0")
    return record


#: config keys that change no measurement (where files go, logging, progress, resumption,
#: device and threads) and the seeds (a cell's runs differ in them by design)
_NOT_A_SETTING = ("seed", "mia.seed", "audit.seed", "paths", "logger", "run_name", "tuned",
                  "trainer.progress", "trainer.resume", "trainer.device", "trainer.num_threads",
                  "trainer.checkpoint", "trainer.eval_batch_size")


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def measurement_setting(record: dict[str, Any]) -> dict[str, str]:
    """Return the flattened config of a record minus what changes no measurement
    (``_NOT_A_SETTING``): every ``mia.*``, ``audit.*``, trainer, data, model, method and
    privacy key, as text. Empty for a record without its config."""
    config = record.get("config")
    if not isinstance(config, dict):
        return {}
    flat = _flatten(config)
    return {key: str(value) for key, value in sorted(flat.items())
            if not any(key == n or key.startswith(n + ".") for n in _NOT_A_SETTING)}


def derived_epsilon(record: dict[str, Any], path: Path) -> dict[str, Any]:
    """Return ``record`` with its epsilon re-derived from its own mechanism, never read.

    A record with a ``privacy_ledger`` (or marked private) must state the epsilon its ledger
    gives under its plan (``privacy.record_check.check_record_epsilon``), else Unreadable names the
    disagreement. One with neither (written by hand, or by a dpbench before ledgers) that
    names an epsilon or a target has no epsilon to derive: both are moved aside
    (``epsilon_underived``, ``target_epsilon_underived``) and it is marked ``underived``, so
    no epsilon column, curve or claim ever shows it; tables put it apart, under ``no ledger``
    (``UNDERIVED_LABEL``). A non-private record (derived epsilon infinite) keeps no target
    either: it is shown among the non-private runs.
    """
    if "privacy_ledger" not in record and record.get("private") is not True:
        named = {key: record.get(key) for key in ("epsilon", "target_epsilon")
                 if _number(record.get(key)) is not None and record.get(key) != math.inf}
        if named:
            return {**record, "epsilon": None, "target_epsilon": None, "underived": True,
                    **{f"{key}_underived": value for key, value in named.items()}}
        return record
    try:
        check_record_epsilon(record, str(path))
    except LedgerMismatch as err:
        raise Unreadable(f"refused: {err}") from None
    if record.get("private") is False and record.get("target_epsilon") is not None:
        return {**record, "target_epsilon": None,
                "target_epsilon_underived": record["target_epsilon"]}
    return record


def iter_records(root: str | Path) -> Iterator[tuple[Path, dict[str, Any] | str]]:
    """Yield (path, record) for every results.json under ``root``; a reason if unreadable.

    Each record gets ``authenticated``: whether its MAC verifies with this user's key
    (``utils.mac``; a colleague's records do not), and its epsilon is re-derived
    (``derived_epsilon``).
    """
    for path in sorted(Path(root).rglob(RESULTS_NAME)):
        try:
            # bounded: a results.json from a shared folder may be huge, nested or not a file
            data = read_bytes(path)
            parsed = parse_json(data, path)
            record = derived_epsilon(check_record(parsed), path)
        except (OSError, UnsafeFile, Unreadable) as err:
            yield path, f"unreadable results.json: {err}"
            continue
        yield path, {**record, "authenticated": is_authentic(path, data)}


def load_records(root: str | Path, status: str | Collection[str] | None = COMPLETED, *,
                 unreadable: bool = False) -> list[dict[str, Any]]:
    """Return the records under ``root``, by path, whose ``status`` is ``status`` (one status,
    a collection of them, or None for any), each with ``_path`` (its file) and ``_sweep`` (the
    first folder under ``root``; empty for a file directly in it).

    A file that cannot be used is left out; with ``unreadable`` it is returned as a record
    with status ``unreadable`` and the reason as ``error``. A record that has its un-noised
    diagnostics under the old key gets them under ``UNPRIVATISED_DIAGNOSTICS``.
    """
    root = Path(root)
    wanted = {status} if isinstance(status, str) else (None if status is None else set(status))
    out = []
    for path, record in iter_records(root):
        parts = path.relative_to(root).parts
        where = {"_path": str(path), "_sweep": parts[0] if len(parts) > 1 else ""}
        if isinstance(record, str):
            if unreadable:
                out.append({"status": UNREADABLE, "error": record, **where})
            continue
        if wanted is not None and record["status"] not in wanted:
            continue
        record = dict(record)
        if UNPRIVATISED_DIAGNOSTICS not in record and OLD_DIAGNOSTICS_KEY in record:
            record[UNPRIVATISED_DIAGNOSTICS] = record.pop(OLD_DIAGNOSTICS_KEY)
        out.append({**record, **where})
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    return str(value)


def record_row(record: dict[str, Any]) -> dict[str, Any]:
    """Return the flat row of one record: its scalar fields plus numeric headline metrics.

    Nested fields (config, history, ledger, ``unprivatised_diagnostics``, ...) stay out: the
    un-privatised training diagnostics are never tabulated, under either of their keys.
    """
    row: dict[str, Any] = {k: v for k, v in record.items() if k not in DIAGNOSTICS_KEYS
                           and (v is None or isinstance(v, (str, int, float, bool)))}
    metrics = record.get("metrics")
    if isinstance(metrics, dict):
        for key, value in metrics.items():
            number = _number(value)
            if number is not None and key not in row:
                row[key] = number
    summary = record.get("method_summary")
    if isinstance(summary, dict):  # released facts of the method, e.g. the floor's share
        for key, value in summary.items():
            number = _number(value)
            if number is not None:
                row[f"method_summary.{key}"] = number
    tuning = record.get("tuning")
    if isinstance(tuning, dict):
        row["tuning_mode"] = _text(tuning.get("mode"))
        chosen = tuning.get("chosen")
        if isinstance(chosen, dict):
            row["tuned_lr"] = _number(chosen.get("method.optimizer.lr"))
        row["total_epsilon"] = _number(tuning.get("total_epsilon"))
        row["lr_at_grid_edge"] = tuning.get("at_grid_edge") if isinstance(
            tuning.get("at_grid_edge"), bool) else None
    evaluation = record.get("evaluation")
    if isinstance(evaluation, dict):
        row["evaluation_split"] = _text(evaluation.get("split"))
    row["unit"] = unit_label(record)
    if record.get("kind") in ("mia", "audit"):  # measurements are grouped by their settings
        row["measurement_setting"] = json.dumps(measurement_setting(record), sort_keys=True)
    if record.get("kind") == "mia":
        row["mia_exceeding"] = _exceeding_attacks(record)
    return row


def unit_label(record: dict[str, Any]) -> str:
    """Return what one epsilon of the record protects, as the report's ``unit`` column:
    ``example`` (records written before the field too), ``window`` / ``observation`` (time
    series), or ``user (uls, k=4)`` / ``user (els, k=4)`` (privacy.unit=user: the strategy
    and the per-user cap k). Epsilons of different units are different guarantees: never
    one cell."""
    unit = _text(record.get("privacy_unit")) or "example"
    if unit != "user":
        return unit
    facts = record.get("user_level")
    facts = facts if isinstance(facts, dict) else {}
    return (f"user ({_text(facts.get('strategy')) or '?'}, "
            f"k={_number(facts.get('max_examples_per_user')) or '?':g})")


def _exceeding_attacks(record: dict[str, Any]) -> str | None:
    """Return "<attack> <epsilon_lower>, ..." for the attacks a dpbench-mia record lists as
    exceeding its accounted epsilon (any attack, not only the headline); None if none."""
    block = record.get("mia")
    if not isinstance(block, dict) or not isinstance(block.get("exceeds_accounted"), list):
        return None
    attacks = block.get("attacks") if isinstance(block.get("attacks"), dict) else {}
    out = []
    for name in block["exceeds_accounted"]:
        found = attacks.get(name) if isinstance(name, str) else None
        bound = found.get("epsilon") if isinstance(found, dict) else None
        value = _number(bound.get("epsilon_lower")) if isinstance(bound, dict) else None
        out.append(f"{str(name)[:40]} {value:.3f}" if value is not None else str(name)[:40])
    return ", ".join(out) or None


def load_frame(root: str | Path) -> pd.DataFrame:
    """Return one row per results.json under ``root``, unreadable ones with status 'unreadable'.

    Adds ``label`` (the method's display name; a private method run without privacy is
    marked ``(non-private)``, one with batches other than Poisson names its sampler, e.g.
    ``dpsgd [shuffle]``) and ``tuning`` (``default`` when the run was not tuned).
    """
    rows = []
    for record in load_records(root, status=None, unreadable=True):
        path = Path(record.pop("_path"))
        record.pop("_sweep")
        rows.append({**record_row(record), "run_dir": str(path.parent)})
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    for col in _SCALARS:
        if col not in frame:
            frame[col] = None
    frame["status"] = frame["status"].fillna(UNREADABLE)
    name = frame["method_name"].fillna(frame["method"]).fillna("?")
    nonpriv = (frame["method"] == "nonprivate") & (name != "nonprivate")
    frame["label"] = name.where(~nonpriv, name + " (non-private)")
    other = frame["sampler"].notna() & (frame["sampler"] != "poisson")
    frame["label"] = frame["label"].where(~other, frame["label"] + " [" +
                                          frame["sampler"].astype(str) + "]")
    frame["tuning"] = frame["tuning_mode"].fillna("default")
    return frame


#: the column of records whose epsilon cannot be derived (no ledger): apart from every
#: epsilon column, and marked as such
UNDERIVED_LABEL = "no ledger"


def eps_label(value: Any, noise_multiplier: Any = None) -> str:
    """Return the column label of a run: ``eps=<target>``; for a private run with a fixed
    noise multiplier and no target, ``sigma=<multiplier>`` (runs at different noise levels
    are different cells); ``eps=n/a`` for non-private runs."""
    if not _missing(value):
        return f"eps={value:g}"
    if not _missing(noise_multiplier):
        return f"sigma={noise_multiplier:g}"
    return "eps=n/a"


def row_eps_label(row: Any) -> str:
    """Return ``eps_label`` of a frame row (its noise multiplier counts for private runs),
    with the run's neighbouring relation when it is not add/remove (``eps=3 (replace-one)``):
    epsilons under different relations are different guarantees, never one column. A row whose
    epsilon cannot be derived gets ``UNDERIVED_LABEL``, apart from every epsilon."""
    if row.get("underived") is True:
        return UNDERIVED_LABEL
    private = row.get("private")
    sigma = row.get("noise_multiplier") if private is True or private == 1 else None
    label = eps_label(row.get("target_epsilon"), sigma)
    relation = row.get("neighbouring")
    if (private is True or private == 1) and isinstance(relation, str) and (
            relation != "add_remove"):
        label += f" ({RELATION_LABEL.get(relation, relation)})"
    return label


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
