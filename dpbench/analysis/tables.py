"""Tables with intervals and verdicts, built from ``load_frame`` rows (docs/tuning-and-claims.md).

- ``cell_table``: mean ± 95 % t-interval over seeds, with n, per method x epsilon cell.
- ``baseline_table``: per cell the paired difference to a named baseline (pairs share the
  seed), its 95 % t-interval and a verdict better / worse / tie.
- ``latex_table``: the cell table, with the best method of a column in bold only where its
  paired difference to every other method of that column is significant.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from dpbench.analysis.results import UNDERIVED_LABEL, row_eps_label
from dpbench.analysis.stats import (
    Interval,
    higher_is_better,
    paired_difference,
    t_interval,
    verdict,
)
from dpbench.logging.records import COMPLETED, FAILED, RUNNING

#: a table row: method, data set, model, tuning and the privacy unit (``results.unit_label``)
ROW_KEYS = ["label", "dataset", "model", "tuning", "unit"]

_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                  "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                  "^": r"\textasciicircum{}"}


def latex_text(value: Any) -> str:
    """Return ``value`` as LaTeX text: special characters escaped, ± as $\\pm$, one line."""
    text = " ".join(str(value).split())
    text = "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)
    return text.replace("±", r"$\pm$")


def markdown_text(value: Any) -> str:
    """Return ``value`` safe inside a markdown table cell or list item (one line, no pipes)."""
    text = " ".join(str(value).split())
    return text.replace("\\", "\\\\").replace("|", "\\|")


def _completed(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Return the completed runs that have ``metric``, with their epsilon column label."""
    if frame.empty or metric not in frame:
        ok = pd.DataFrame(columns=[*ROW_KEYS, "seed", "target_epsilon", metric])
    else:
        ok = frame[(frame["status"] == COMPLETED) & frame[metric].notna()].copy()
    if "unit" not in ok:  # records and frames without the column: one example
        ok["unit"] = "example"
    ok["unit"] = ok["unit"].fillna("example")
    ok["eps"] = ok.apply(row_eps_label, axis=1) if len(ok) else pd.Series(dtype=object)
    return ok


def _by_seed(group: pd.DataFrame, metric: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for seed, value in zip(group["seed"], group[metric]):
        if seed is not None and value is not None and not pd.isna(seed) and not pd.isna(value):
            out[int(seed)] = float(value)
    return out


def cell_intervals(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Return one row per (method, data set, model, tuning, epsilon) with its interval."""
    ok = _completed(frame, metric)
    rows = []
    for key, group in ok.groupby([*ROW_KEYS, "eps"], dropna=False):
        interval = t_interval(group[metric].tolist())
        rows.append({**dict(zip([*ROW_KEYS, "eps"], key)), "interval": interval,
                     "n": interval.n, "seeds": _by_seed(group, metric)})
    out = pd.DataFrame(rows)
    for status, column in ((FAILED, "failed"), (RUNNING, "incomplete")):
        out[column] = 0
        for _, row in frame[frame["status"] == status].iterrows() if not frame.empty else ():
            key = (*(row.get(k, "example" if k == "unit" else None) for k in ROW_KEYS),
                   row_eps_label(row))
            match = (out[[*ROW_KEYS, "eps"]].apply(tuple, axis=1) == key) if len(out) else None
            if match is not None and match.any():
                out.loc[match, column] += 1
            else:
                extra = {**dict(zip([*ROW_KEYS, "eps"], key)), "interval": t_interval([]),
                         "n": 0, "seeds": {}, "failed": 0, "incomplete": 0, column: 1}
                out = pd.concat([out, pd.DataFrame([extra])], ignore_index=True)
    return out.reset_index(drop=True)


def _eps_order(columns) -> list[str]:
    """Order columns: targets by epsilon, then fixed noise multipliers, then non-private;
    one value's relations (``eps=3``, ``eps=3 (replace-one)``) side by side."""
    def key(c: str) -> tuple[int, float, str]:
        if c == "eps=n/a":
            return (2, math.inf, "")
        if c == UNDERIVED_LABEL:  # no derivable epsilon: last, apart from every epsilon
            return (3, math.inf, "")
        name, _, value = c.partition("=")
        number, _, relation = value.partition(" ")
        return (0 if name == "eps" else 1, float(number), relation)

    return sorted(columns, key=key)


def _cell_text(row: pd.Series, digits: int) -> str:
    text = row["interval"].format(digits) if row["n"] else ""
    extra = [f"{int(row[c])} {c}" for c in ("failed", "incomplete") if row.get(c)]
    if extra:
        text = (text + " " if text else "") + "(" + ", ".join(extra) + ")"
    return text or "n/a"


def cell_table(frame: pd.DataFrame, metric: str, digits: int = 4) -> pd.DataFrame:
    """Return the method x epsilon table: ``mean ± half-width (n=k)`` per cell."""
    cells = cell_intervals(frame, metric)
    if cells.empty:
        return pd.DataFrame()
    cells["cell"] = cells.apply(lambda r: _cell_text(r, digits), axis=1)
    wide = cells.pivot_table(index=ROW_KEYS, columns="eps", values="cell", aggfunc="first")
    if only_examples(cells):  # the unit column only where a run protects something else
        wide = wide.droplevel("unit")
    return wide[_eps_order(wide.columns)]


def only_examples(cells: pd.DataFrame) -> bool:
    """Return whether every cell's privacy unit is one example (the tables then leave out
    the ``unit`` column, as they did before runs could protect a user)."""
    return "unit" not in cells or set(cells["unit"].fillna("example")) <= {"example"}


def baseline_table(frame: pd.DataFrame, metric: str, baseline: str,
                   digits: int = 4) -> pd.DataFrame:
    """Return per cell: method - baseline (paired by seed), its 95 % CI and the verdict."""
    cells = cell_intervals(frame, metric)
    better_high = higher_is_better(metric)
    rows = []
    if cells.empty:
        return pd.DataFrame()
    base = cells[cells["label"] == baseline]
    for _, row in cells[cells["label"] != baseline].iterrows():
        ref = base[(base["dataset"] == row["dataset"]) & (base["model"] == row["model"])
                   & (base["eps"] == row["eps"]) & (base["unit"] == row["unit"])]
        if ref.empty:
            continue
        diff = paired_difference(row["seeds"], ref.iloc[0]["seeds"])
        rows.append({"method": row["label"], "dataset": row["dataset"], "model": row["model"],
                     "tuning": row["tuning"], "unit": row["unit"], "eps": row["eps"],
                     "difference": diff.format(digits) if diff.n else "n/a",
                     "ci_low": diff.low, "ci_high": diff.high, "n_pairs": diff.n,
                     "verdict": verdict(diff, better_high)})
    out = pd.DataFrame(rows)
    return out.drop(columns=["unit"]) if only_examples(cells) and not out.empty else out


def significant_best(cells: pd.DataFrame, metric: str) -> set[tuple]:
    """Return the (row key, eps) cells that beat every other method of their column.

    A column is one (data set, model, epsilon); the best mean is bold only if its paired
    difference with each other method's runs is significantly in its favour.
    """
    better_high = higher_is_better(metric)
    winners = set()
    for _, column in cells[cells["n"] > 0].groupby(["dataset", "model", "unit", "eps"],
                                                   dropna=False):
        if len(column) < 2:
            continue
        means = column["interval"].map(lambda i: i.mean)
        best = column.loc[means.idxmax() if better_high else means.idxmin()]
        if all(verdict(paired_difference(best["seeds"], other["seeds"]), better_high)
               == "better" for _, other in column.iterrows() if other.name != best.name):
            winners.add((*[best[k] for k in ROW_KEYS], best["eps"]))
    return winners


def latex_table(frame: pd.DataFrame, metric: str, digits: int = 3) -> str:
    """Return a LaTeX tabular of the cell table with significant winners in bold."""
    cells = cell_intervals(frame, metric)
    if cells.empty:
        return "% no completed runs\n"
    bold = significant_best(cells, metric)
    columns = _eps_order(cells["eps"].unique())
    keys = [k for k in ROW_KEYS if k != "unit" or not only_examples(cells)]
    lines = [r"\begin{tabular}{l" + "l" * (len(keys) - 1) + "c" * len(columns) + "}",
             r"\toprule",
             " & ".join([*("method" if k == "label" else k for k in keys),
                         *(r"$\varepsilon$=" + latex_text(c[4:]) for c in columns)])
             + r" \\", r"\midrule"]
    for key, group in cells.groupby(keys, dropna=False):
        values = []
        for col in columns:
            match = group[group["eps"] == col]
            if match.empty or not match.iloc[0]["n"]:
                values.append("--")
                continue
            interval: Interval = match.iloc[0]["interval"]
            text = (f"{interval.mean:.{digits}f} $\\pm$ {interval.half_width:.{digits}f}"
                    if interval.n > 1 else f"{interval.mean:.{digits}f}")
            full = (*key, "example") if len(keys) < len(ROW_KEYS) else tuple(key)
            values.append(rf"\textbf{{{text}}}" if (*full, col) in bold else text)
        lines.append(" & ".join([*(latex_text(k) for k in key), *values]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def markdown_table(table: pd.DataFrame) -> str:
    """Return ``table`` (index reset) as markdown, cells escaped and printed as formatted."""
    if table.empty:
        return "(no rows)"
    flat = table.reset_index() if not isinstance(table.index, pd.RangeIndex) else table
    out = flat.map(lambda v: v if v is None or (isinstance(v, float) and math.isnan(v))
                   else markdown_text(v))
    out.columns = [markdown_text(c) for c in out.columns]
    return out.to_markdown(index=False, disable_numparse=True)
