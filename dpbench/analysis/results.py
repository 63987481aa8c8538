"""One loader of ``results.json`` records for every table, report and claim.

Records are read as JSON (never unpickled); a file that is not a JSON object with the fields
a table needs becomes an ``unreadable`` row with the reason, and the rest are still loaded.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

RESULTS_NAME = "results.json"

#: record fields kept as columns (everything else stays in the record)
_SCALARS = ("method", "method_name", "dataset", "model", "privacy", "seed", "run_name",
            "target_epsilon", "epsilon", "delta", "noise_multiplier", "sample_rate", "steps",
            "accountant", "status", "error", "wall_time_s", "private", "grad_sample_mode",
            "tuning_mode", "tuned_lr", "total_epsilon", "evaluation_split")


def iter_records(root: str | Path) -> Iterator[tuple[Path, dict[str, Any] | str]]:
    """Yield (path, record) for every results.json under ``root``; a reason string if unreadable."""
    for path in sorted(Path(root).rglob(RESULTS_NAME)):
        try:
            record = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            yield path, f"unreadable: {type(err).__name__}: {err}"
            continue
        if not isinstance(record, dict):
            yield path, f"unreadable: expected a JSON object, got {type(record).__name__}"
            continue
        yield path, record


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    return str(value)


def record_row(record: dict[str, Any]) -> dict[str, Any]:
    """Return the flat row of one record: scalar fields plus numeric headline metrics."""
    row: dict[str, Any] = {}
    for key in _SCALARS:
        value = record.get(key)
        row[key] = _number(value) if key in (
            "seed", "target_epsilon", "epsilon", "delta", "noise_multiplier", "sample_rate",
            "steps", "wall_time_s", "tuned_lr", "total_epsilon") else _text(value)
    metrics = record.get("metrics")
    if isinstance(metrics, dict):
        for key, value in metrics.items():
            number = _number(value)
            if number is not None and key not in row:
                row[key] = number
    tuning = record.get("tuning")
    if isinstance(tuning, dict):
        row["tuning_mode"] = _text(tuning.get("mode"))
        chosen = tuning.get("chosen")
        if isinstance(chosen, dict):
            row["tuned_lr"] = _number(chosen.get("method.optimizer.lr"))
        row["total_epsilon"] = _number(tuning.get("total_epsilon"))
    return row


def load_frame(root: str | Path) -> pd.DataFrame:
    """Return one row per results.json under ``root``, unreadable ones with status 'unreadable'.

    Adds ``label`` (the method's display name; a private method run without privacy is
    marked ``(non-private)``) and ``tuning`` (``default`` when the run was not tuned).
    """
    rows = []
    for path, record in iter_records(root):
        if isinstance(record, str):
            rows.append({"run_dir": str(path.parent), "status": "unreadable", "error": record})
            continue
        rows.append({**record_row(record), "run_dir": str(path.parent)})
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    for col in _SCALARS:
        if col not in frame:
            frame[col] = None
    frame["status"] = frame["status"].fillna("unreadable")
    name = frame["method_name"].fillna(frame["method"]).fillna("?")
    nonpriv = (frame["method"] == "nonprivate") & (name != "nonprivate")
    frame["label"] = name.where(~nonpriv, name + " (non-private)")
    frame["tuning"] = frame["tuning_mode"].fillna("default")
    return frame


def eps_label(value: Any) -> str:
    """Return the column label of a target epsilon (``eps=n/a`` for non-private runs)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "eps=n/a"
    return f"eps={value:g}"
