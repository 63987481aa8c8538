"""Privacy measured beside utility: one row per cell joining three kinds of records.

A cell is (method, data set, model, epsilon). Its columns come from the records of that
cell, each kind kept to its own columns and never pooled: the utility runs (``dpbench``) give
the metric, the audits (``kind: audit``, ``dpbench-audit``) epsilon_lower and its power, the
membership-inference runs (``kind: mia``, ``dpbench-mia``) the headline attack's AUC and TPR
at 0.1 % and 1 % FPR and its epsilon lower bound. The accounted epsilon is the mean over the
cell's runs of every kind.

Measurements are compared only like with like: MIA and audit runs are grouped by every
setting that changes what they measure (``results.measurement_setting``: ``mia.*``,
``audit.*``, trainer, data, model, method, privacy), one row per setting with the keys that
differ named in ``setting``; copies of one run (same cell, setting and seed) count once. Over
seeds AUC and TPR are the mean ± 95 % t-interval (a single MIA run shows its own bootstrap
interval ``[low, high]``); an epsilon lower bound is never averaged: the column shows the
largest per-seed bound with its seed (each a 95 % bound on its own), with the smallest
ceiling (the bound of a perfect attack at that size). ``warning`` names any run whose lower
bound exceeds its accounted epsilon (docs/empirical-privacy.md).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from dpbench.analysis.results import row_eps_label
from dpbench.analysis.stats import t_interval
from dpbench.logging.records import COMPLETED

CELL_KEYS = ["label", "dataset", "model", "eps"]
#: the MIA columns shown as mean ± t over seeds: (record field, column title)
MIA_COLUMNS = (("mia_auc", "MIA AUC"), ("mia_tpr_at_0p1pct_fpr", "TPR@0.1%FPR"),
               ("mia_tpr_at_1pct_fpr", "TPR@1%FPR"))
#: lower bounds, each with the run's accounted epsilon field: (bound, claim field, title)
LOWER_BOUNDS = (("mia_epsilon_lower", "epsilon", "MIA epsilon_lower"),
                ("epsilon_lower", "epsilon_claimed", "epsilon_lower (audit)"),
                ("epsilon_lower_fdp", "epsilon_claimed", "epsilon_lower (audit, f-DP)"))


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


def largest_bound(group: pd.DataFrame, name: str, ceiling: str | None = None) -> str:
    """Return the largest per-seed lower bound ``name`` with its seed, the number of seeds
    and the smallest ``ceiling`` among them: ``max 0.34 (seed 2 of 3; ceiling 2.64)``."""
    rows = group[_column(group, name).notna()]
    if rows.empty:
        return ""
    best = rows.loc[rows[name].astype(float).idxmax()]
    seed = best.get("seed")
    seed = "?" if seed is None or pd.isna(seed) else int(seed)
    text = f"max {float(best[name]):.3f} (seed {seed} of {len(rows)}"
    ceilings = _values(rows, ceiling) if ceiling else []
    return text + (f"; ceiling {min(ceilings):.3f})" if ceilings else ")")


def violations(group: pd.DataFrame) -> list[str]:
    """Return "<bound> <value> > <epsilon> (seed s)" for every run of ``group`` whose lower
    bound exceeds its own accounted epsilon."""
    out = []
    for bound, claim, _ in LOWER_BOUNDS:
        for _, run in group.iterrows():
            value, eps = run.get(bound), run.get(claim)
            listed = run.get("mia_exceeding")
            if bound == "mia_epsilon_lower" and isinstance(listed, str) and listed:
                continue  # named below with every other attack of the run
            if (value is None or eps is None or pd.isna(value) or pd.isna(eps)
                    or not float(value) > float(eps)):
                continue
            seed = run.get("seed")
            out.append(f"{bound} {float(value):.3f} > {float(eps):.3f} (seed "
                       f"{'?' if seed is None or pd.isna(seed) else int(seed)})")
    for _, run in group.iterrows():  # any attack of a dpbench-mia run, not only the headline
        listed, eps, seed = run.get("mia_exceeding"), run.get("epsilon"), run.get("seed")
        if isinstance(listed, str) and listed:
            out.append(f"epsilon_lower of {listed} > {float(eps):.3f} (seed "
                       f"{'?' if seed is None or pd.isna(seed) else int(seed)})")
    return list(dict.fromkeys(out))


def _settings(frame: pd.DataFrame) -> pd.Series:
    return _column(frame, "measurement_setting").fillna("{}").astype(str)


def differing_keys(settings: list[str]) -> list[dict[str, str]]:
    """Return, per setting (JSON text of ``measurement_setting``), only the keys in which
    the given settings differ (a key one of them lacks counts as differing)."""
    parsed = [json.loads(s) for s in settings]
    keys = sorted(set().union(*parsed)) if parsed else []
    varying = [k for k in keys if len({p.get(k) for p in parsed}) > 1]
    return [{k: p.get(k, "(unset)") for k in varying} for p in parsed]


def drop_copies(measured: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return (measurement runs with one run per cell, setting and seed; the copies left out,
    the first by folder kept): two copies of one seed are not two seeds."""
    if measured.empty:
        return measured, measured.iloc[0:0]
    keys = measured[CELL_KEYS].astype(str).assign(
        setting=_settings(measured), seed=_column(measured, "seed").astype(str),
        kind=_column(measured, "kind").astype(str))
    order = keys.assign(run_dir=_column(measured, "run_dir").astype(str)).sort_values(
        "run_dir").index
    copies = keys.loc[order].duplicated(keep="first")
    dropped = copies[copies].index
    return measured.drop(index=dropped), measured.loc[dropped]


def empirical_table(frame: pd.DataFrame, metric: str = "accuracy") -> pd.DataFrame:
    """Return the joint table (``CELL_KEYS``, the measurement setting, utility, epsilon, audit
    and MIA columns; one row per cell and distinct measurement setting)."""
    done = frame[frame["status"] == COMPLETED] if "status" in frame else frame.iloc[0:0]
    if done.empty:
        return pd.DataFrame()
    done = done.assign(eps=done.apply(row_eps_label, axis=1))
    mia, audit = is_mia(done), _is_audit(done)
    measured, copies = drop_copies(done[mia | audit])
    done = pd.concat([done[~mia & ~audit], measured])
    mia, audit = is_mia(done), _is_audit(done)
    copy_keys = [(*(str(r[k]) for k in CELL_KEYS), setting) for (_, r), setting in
                 zip(copies.iterrows(), _settings(copies))]
    rows: list[dict[str, Any]] = []
    for key, group in done.groupby(CELL_KEYS, dropna=False):
        g_mia_all, g_audit_all = group[mia[group.index]], group[audit[group.index]]
        if g_mia_all.empty and g_audit_all.empty:
            continue  # a cell without any privacy measurement
        utility = group[~mia[group.index] & ~audit[group.index]]
        eps = [e for e in _values(group, "epsilon") if math.isfinite(e)]
        base: dict[str, Any] = dict(zip(CELL_KEYS, key))
        base[metric] = _cell(utility, metric)
        base["epsilon (accounted)"] = t_interval(eps).format(3) if eps else "inf"
        # each kind's runs split by their settings; one row when each kind has one setting
        parts: list[tuple[str, pd.DataFrame, pd.DataFrame]] = []
        for kind_rows, as_mia in ((g_mia_all, True), (g_audit_all, False)):
            settings = sorted(set(_settings(kind_rows)))
            for setting, named in zip(settings, differing_keys(settings)):
                sub = kind_rows[_settings(kind_rows) == setting]
                label = ", ".join(f"{k}={v}" for k, v in named.items())
                parts.append((label, sub if as_mia else sub.iloc[0:0],
                              sub.iloc[0:0] if as_mia else sub))
        if len(parts) == 2 and not parts[0][1].empty and not parts[1][2].empty:
            parts = [("", parts[0][1], parts[1][2])]  # one MIA setting, one audit setting
        for label, g_mia, g_audit in parts:
            row = {**base, "setting": label}
            row["epsilon_lower (audit)"] = largest_bound(g_audit, "epsilon_lower",
                                                         "audit_ceiling")
            row["epsilon_lower (audit, f-DP)"] = largest_bound(g_audit, "epsilon_lower_fdp",
                                                               "audit_ceiling_fdp")
            row["audit power"] = _cell(g_audit, "audit_power")
            row[f"{metric} (MIA targets)"] = _cell(g_mia, metric)
            attacks = sorted({str(a) for a in _column(g_mia, "mia_attack").dropna()})
            row["attack"] = ", ".join(attacks)
            for name, title in MIA_COLUMNS:
                row[title] = _cell(g_mia, name, own_interval=True)
            row["MIA epsilon_lower"] = largest_bound(g_mia, "mia_epsilon_lower",
                                                     "mia_epsilon_ceiling")
            runs = pd.concat([g_mia, g_audit])
            n_copies = sum(copy_keys.count((*(str(k) for k in key), s))
                           for s in set(_settings(runs)))
            row["runs"] = f"{len(runs)}" + (f" ({n_copies} copies left out)" if n_copies
                                            else "")
            row["warning"] = "; ".join(violations(runs))
            rows.append(row)
    return pd.DataFrame(rows)


def empirical_series(frame: pd.DataFrame, name: str) -> list[tuple[str, Any]]:
    """Return the panel's lines for the MIA field ``name``: (legend, points) per method and
    measurement setting, points being [(accounted epsilon, t-interval over seeds)] sorted by
    epsilon, or a float (the mean level) for runs without privacy.

    Every private run is placed at its accounted epsilon (the mean over its cell's runs),
    fixed-noise runs included; copies of one run count once.
    """
    done = frame[(frame["status"] == COMPLETED) & is_mia(frame)] if "status" in frame else None
    if done is None or done.empty:
        return []
    done, _ = drop_copies(done.assign(eps=done.apply(row_eps_label, axis=1)))
    # a line runs across epsilons: its setting leaves out the privacy keys (the x axis)
    line_setting = _settings(done).map(lambda text: json.dumps(
        {k: v for k, v in json.loads(text).items() if not k.startswith("privacy.")},
        sort_keys=True))
    accounted = pd.to_numeric(_column(done, "epsilon"), errors="coerce")
    lines: list[tuple[str, Any]] = []
    for label, by_label in done.groupby("label"):
        settings = sorted(set(line_setting[by_label.index]))
        names = {s: ", ".join(f"{k}={v}" for k, v in d.items())
                 for s, d in zip(settings, differing_keys(settings))}
        for setting in settings:
            group = by_label[line_setting[by_label.index] == setting]
            lines.append(_series(label, names[setting], group, name, accounted))
    return lines


def _series(label: str, differs: str, group: pd.DataFrame, name: str,
            accounted: pd.Series) -> tuple[str, Any]:
    """Return one line of ``empirical_series``."""
    legend = f"{label}" + (f" [{differs}]" if differs else "")
    finite = accounted[group.index].map(lambda e: bool(e == e and math.isfinite(e)))
    if not finite.any():  # no privacy: a level, not a point on the epsilon axis
        return legend, float(group[name].astype(float).mean())
    private = group[finite]
    points = [(float(accounted[g.index].mean()), t_interval(g[name].astype(float).tolist()))
              for _, g in private.groupby("eps")]
    return legend, sorted(points, key=lambda point: point[0])


def empirical_plot(frame: pd.DataFrame, path: Path) -> bool:
    """Write the "empirical" panels (``empirical_series`` of MIA AUC and TPR at 1 % FPR
    against the accounted epsilon, 95 % t bars; non-private runs as dashed levels).
    Return False (nothing written) when no MIA run is there."""
    panels = [(name, title, empirical_series(frame, name))
              for name, title in (("mia_auc", "MIA AUC"),
                                  ("mia_tpr_at_1pct_fpr", "TPR at 1 % FPR"))]
    if not panels[0][2]:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for ax, (name, title, lines) in zip(axes, panels):
        for legend, points in lines:
            if isinstance(points, float):
                ax.axhline(points, ls="--", color="gray", label=legend)
                continue
            ax.errorbar([e for e, _ in points], [i.mean for _, i in points],
                        yerr=[[i.mean - i.low if i.n > 1 else 0 for _, i in points],
                              [i.high - i.mean if i.n > 1 else 0 for _, i in points]],
                        marker="o", capsize=3, label=legend)
        ax.axhline(0.5 if name == "mia_auc" else 0.01, color="k", lw=0.6, ls=":",
                   label="chance")
        ax.set(xscale="log", xlabel="accounted epsilon", ylabel=title,
               title=f"empirical: {title}")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
