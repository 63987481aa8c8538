"""The claims table: each paper claim, the paper's number, dpbench's measurement with its 95 %
CI, and a verdict reproduced / contradicted / inconclusive (docs/tuning-and-claims.md, "Claims").

A claim is declared in ``conf/reproduce/<paper>.yaml`` and evaluated on the runs its
reproduction wrote. Kinds:

- ``difference``: ``metric`` of ``method`` minus ``baseline``, paired by seed, per cell of
  ``where`` (``method_where`` / ``baseline_where`` add conditions on one side, e.g. an
  ablation's setting); the paper claims ``expect`` (better / worse / tie). Reproduced
  when every cell has that verdict, contradicted when a cell has the opposite one,
  inconclusive otherwise (``not_worse``: better or tie; ``tie``: contradicted by any
  significant difference).
- ``value``: the mean of ``metric`` over the selected runs against ``threshold`` with
  ``expect`` ``above`` / ``below``: reproduced when the whole CI is on the claimed side,
  contradicted when it is wholly on the other side.
- ``steps_saving``: 1 - steps-to-target(method) / steps(baseline) per seed pair, the target
  being the baseline's final ``metric`` (``dpbench.analysis.steps_to_target``), compared to
  ``threshold`` as ``value``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dpbench.analysis.results import iter_records
from dpbench.analysis.stats import Interval, higher_is_better, paired_difference, t_interval
from dpbench.analysis.stats import verdict as diff_verdict
from dpbench.analysis.steps_to_target import compare_to_baseline

VERDICTS = ("reproduced", "contradicted", "inconclusive", "not run")
_OPPOSITE = {"better": "worse", "worse": "better"}


def lookup(record: dict[str, Any], key: str) -> Any:
    """Return ``record[key]`` for a dotted key (``config.method.settings.filter``)."""
    value: Any = record
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _matches(record: dict[str, Any], where: dict[str, Any]) -> bool:
    for key, wanted in where.items():
        value = lookup(record, key)
        if isinstance(value, float) and isinstance(wanted, (int, float)):
            if not math.isclose(value, float(wanted)):
                return False
        elif value != wanted:
            return False
    return True


def load_completed(root: str | Path) -> list[dict[str, Any]]:
    """Return every completed record under ``root`` (unreadable and failed ones skipped)."""
    return [r for _, r in iter_records(root)
            if isinstance(r, dict) and r.get("status") == "completed"]


def select(records: Iterable[dict[str, Any]], method: str | None,
           where: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in records if (method is None or r.get("method_name") == method)
            and _matches(r, where)]


def _metric(record: dict[str, Any], metric: str) -> float | None:
    value = (record.get("metrics") or {}).get(metric, record.get(metric))
    if value is None and "." in metric:
        value = lookup(record, metric)  # e.g. method_summary.floor_binding_share
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _by_seed(records: list[dict[str, Any]], metric: str) -> dict[int, float]:
    return {int(r["seed"]): v for r in records if (v := _metric(r, metric)) is not None}


def _cells(where: dict[str, Any]) -> list[dict[str, Any]]:
    """Expand list-valued ``where`` entries into one cell per value (cartesian product)."""
    cells: list[dict[str, Any]] = [{}]
    for key, value in where.items():
        values = value if isinstance(value, list) else [value]
        cells = [{**c, key: v} for c in cells for v in values]
    return cells


def _difference_verdict(got: str, expect: str) -> str:
    """Map a cell's better / worse / tie to the claim's verdict."""
    if got == "n/a":
        return "inconclusive"
    if expect == "not_worse":
        return "contradicted" if got == "worse" else "reproduced"
    if expect == "tie":
        return "reproduced" if got == "tie" else "contradicted"
    if got == expect:
        return "reproduced"
    return "contradicted" if got == _OPPOSITE.get(expect) else "inconclusive"


def _threshold_verdict(interval: Interval, threshold: float, expect: str) -> str:
    if interval.n < 2:
        return "inconclusive"
    above = interval.low > threshold
    below = interval.high < threshold
    if expect == "above":
        return "reproduced" if above else "contradicted" if below else "inconclusive"
    return "reproduced" if below else "contradicted" if above else "inconclusive"


def _cell_label(cell: dict[str, Any], where: dict[str, Any]) -> str:
    """Name the cell by the ``where`` keys that vary (list-valued) only."""
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in cell.items()
                     if isinstance(where.get(k), list))


def evaluate_claim(claim: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """Return the claim with ``measured`` (text, per cell CI) and ``verdict``."""
    kind = claim.get("kind", "difference")
    metric = claim["metric"]
    parts, verdicts, runs = [], [], 0
    where = claim.get("where") or {}
    for cell in _cells(where):
        if kind == "difference":
            mine = _by_seed(select(records, claim["method"],
                                   {**cell, **claim.get("method_where", {})}), metric)
            base = _by_seed(select(records, claim["baseline"],
                                   {**cell, **claim.get("baseline_where", {})}), metric)
            diff = paired_difference(mine, base)
            runs += len(mine) + len(base)
            got = diff_verdict(diff, higher_is_better(metric))
            verdicts.append(_difference_verdict(got, claim.get("expect", "better")))
            parts.append(f"{_cell_label(cell, where)}: {diff.format(claim.get('digits', 3))} "
                         f"({got})".lstrip(": "))
        else:
            if kind == "value":
                values = [v for r in select(records, claim.get("method"), cell)
                          if (v := _metric(r, metric)) is not None]
            elif kind == "steps_saving":
                values = _steps_savings(records, claim, cell)
            else:
                raise ValueError(f"unknown claim kind {kind!r}")
            interval = t_interval(values)
            runs += len(values)
            verdicts.append(_threshold_verdict(interval, float(claim["threshold"]),
                                               claim.get("expect", "above")))
            parts.append(f"{_cell_label(cell, where)}: {interval.format(claim.get('digits', 3))}"
                         .lstrip(": "))
    if not runs:
        overall = "not run"
    elif all(v == "reproduced" for v in verdicts):
        overall = "reproduced"
    elif any(v == "contradicted" for v in verdicts):
        overall = "contradicted"
    else:
        overall = "inconclusive"
    return {**claim, "measured": "; ".join(parts) or "no runs", "verdict": overall}


def _steps_savings(records: list[dict[str, Any]], claim: dict[str, Any],
                   cell: dict[str, Any]) -> list[float]:
    mine = {int(r["seed"]): r for r in select(records, claim["method"], cell)}
    base = {int(r["seed"]): r for r in select(records, claim["baseline"], cell)}
    out = []
    for seed in sorted(set(mine) & set(base)):
        try:
            row = compare_to_baseline(base[seed], mine[seed], claim["metric"])
        except ValueError:
            continue  # a run without evaluations over steps cannot say
        # never reaching the target within the run counts as no saving at all
        out.append(row["speedup_pct"] / 100.0 if row["reached"] else 0.0)
    return out


def claims_markdown(rows: list[dict[str, Any]]) -> str:
    """Return the claims table: claim, paper, measured (95 % CI), verdict, command."""
    from dpbench.analysis.tables import markdown_text

    lines = ["| paper | claim | paper's number | dpbench (mean ± 95 % CI, n) | verdict | "
             "command |", "|---|---|---|---|---|---|"]
    for row in rows:
        cells = [markdown_text(row.get(k, "")) for k in (
            "paper", "claim", "paper_value", "measured", "verdict")]
        lines.append("| " + " | ".join(cells) + f" | `{row.get('command', '')}` |")
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    return "\n".join(lines) + "\n\n" + ", ".join(f"{n} {v}" for v, n in counts.items()) + "\n"
