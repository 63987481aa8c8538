"""Privacy measured beside utility: one row per cell joining three kinds of records.

A cell is (method, data set, model, epsilon). Its columns come from the records of that
cell, each kind kept to its own columns and never pooled: the utility runs (``dpbench``) give
the metric, the audits (``kind: audit``, ``dpbench-audit``) epsilon_lower and its power, the
membership-inference runs (``kind: mia``, ``dpbench-mia``) the headline attack's AUC and TPR
at 0.1 % and 1 % FPR and its epsilon lower bound. The accounted epsilon is the mean over the
cell's runs of every kind. Over several seeds a column is the mean ± 95 % t-interval; a
single MIA run shows its own bootstrap interval ``[low, high]`` (docs/empirical-privacy.md).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from dpbench.analysis.results import row_eps_label
from dpbench.analysis.stats import t_interval
from dpbench.logging.records import COMPLETED
from dpbench.utils.io import save_figure

CELL_KEYS = ["label", "dataset", "model", "eps"]
#: the MIA columns: (record field, column title)
MIA_COLUMNS = (("mia_auc", "MIA AUC"), ("mia_tpr_at_0p1pct_fpr", "TPR@0.1%FPR"),
               ("mia_tpr_at_1pct_fpr", "TPR@1%FPR"), ("mia_epsilon_lower", "MIA epsilon_lower"))


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    return frame[name] if name in frame else pd.Series(None, index=frame.index, dtype=object)


def is_mia(frame: pd.DataFrame) -> pd.Series:
    """Return which rows are ``dpbench-mia`` runs (never pooled with the utility runs)."""
    return (_column(frame, "kind") == "mia") | _column(frame, "mia_auc").notna()


def _is_audit(frame: pd.DataFrame) -> pd.Series:
    return (_column(frame, "kind") == "audit") | _column(frame, "epsilon_lower").notna()


def _values(group: pd.DataFrame, name: str) -> list[float]:
    return [float(v) for v in _column(group, name) if v is not None and not pd.isna(v)]


def _cell(group: pd.DataFrame, name: str, own_interval: bool = False) -> str:
    """Return the column ``name`` of a cell's runs: mean ± t-interval, or for one run with
    ``<name>_low``/``_high`` fields its own interval."""
    values = _values(group, name)
    if not values:
        return ""
    if own_interval and len(values) == 1:
        low, high = _values(group, f"{name}_low"), _values(group, f"{name}_high")
        if low and high:
            return f"{values[0]:.4f} [{low[0]:.4f}, {high[0]:.4f}] (n=1)"
    return t_interval(values).format()


def empirical_table(frame: pd.DataFrame, metric: str = "accuracy") -> pd.DataFrame:
    """Return the joint table (``CELL_KEYS`` + utility, epsilon, audit and MIA columns)."""
    done = frame[frame["status"] == COMPLETED] if "status" in frame else frame.iloc[0:0]
    if done.empty:
        return pd.DataFrame()
    done = done.assign(eps=done.apply(row_eps_label, axis=1))
    mia, audit = is_mia(done), _is_audit(done)
    rows: list[dict[str, Any]] = []
    for key, group in done.groupby(CELL_KEYS, dropna=False):
        g_mia, g_audit = group[mia[group.index]], group[audit[group.index]]
        if g_mia.empty and g_audit.empty:
            continue  # a cell without any privacy measurement
        utility = group[~mia[group.index] & ~audit[group.index]]
        eps = [e for e in _values(group, "epsilon") if math.isfinite(e)]
        row: dict[str, Any] = dict(zip(CELL_KEYS, key))
        row[metric] = _cell(utility, metric)
        row["epsilon (accounted)"] = t_interval(eps).format(3) if eps else "inf"
        row["epsilon_lower (audit)"] = _cell(g_audit, "epsilon_lower")
        row["audit power"] = _cell(g_audit, "audit_power")
        row[f"{metric} (MIA targets)"] = _cell(g_mia, metric)
        attacks = sorted({str(a) for a in _column(g_mia, "mia_attack").dropna()})
        row["attack"] = ", ".join(attacks)
        for name, title in MIA_COLUMNS:
            row[title] = _cell(g_mia, name, own_interval=True)
        rows.append(row)
    return pd.DataFrame(rows)


def empirical_plot(frame: pd.DataFrame, path: Path) -> bool:
    """Write the "empirical" panels (MIA AUC and TPR at 1 % FPR against the accounted
    epsilon, one line per method with 95 % t bars; non-private runs as dashed levels).
    Return False (nothing written) when no MIA run is there."""
    done = frame[(frame["status"] == COMPLETED) & is_mia(frame)] if "status" in frame else None
    if done is None or done.empty:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for ax, (name, title) in zip(axes, (("mia_auc", "MIA AUC"),
                                        ("mia_tpr_at_1pct_fpr", "TPR at 1 % FPR"))):
        for label, group in done.groupby("label"):
            private = group[group["target_epsilon"].notna()]
            if private.empty:
                ax.axhline(float(group[name].mean()), ls="--", color="gray",
                           label=f"{label}")
                continue
            points = [(float(e), t_interval(g[name].tolist()))
                      for e, g in private.groupby("target_epsilon")]
            ax.errorbar([e for e, _ in points], [i.mean for _, i in points],
                        yerr=[[i.mean - i.low if i.n > 1 else 0 for _, i in points],
                              [i.high - i.mean if i.n > 1 else 0 for _, i in points]],
                        marker="o", capsize=3, label=str(label))
        ax.axhline(0.5 if name == "mia_auc" else 0.01, color="k", lw=0.6, ls=":",
                   label="chance")
        ax.set(xscale="log", xlabel="accounted epsilon (target)", ylabel=title,
               title=f"empirical: {title}")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
    return True
