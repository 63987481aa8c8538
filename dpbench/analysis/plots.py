"""Figures from ``load_frame`` rows: privacy-utility curves with 95 % bands, Pareto scatters."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from dpbench.analysis.stats import t_interval
from dpbench.logging.records import COMPLETED
from dpbench.utils.io import save_figure


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def utility_curves(frame: pd.DataFrame, metric: str) -> dict[str, list | float]:
    """Return per method either its curve [(epsilon, interval)] or, for a method with no
    private run, the mean of its non-private runs (a reference level).

    A cell's epsilon is its target; for runs at a fixed noise multiplier (no target) it is
    the mean epsilon those runs spent, one point per multiplier, so a sigma grid is a curve
    too and never mistaken for a non-private level.
    """
    ok = frame[(frame["status"] == COMPLETED)]
    if "underived" in ok:  # no derivable epsilon: on no curve, nor as a non-private level
        ok = ok[ok["underived"] != True]  # noqa: E712
    ok = ok[ok[metric].notna()] if metric in ok else ok.iloc[0:0]
    curves: dict[str, list | float] = {}
    for label, group in ok.groupby("label"):
        # load_frame always has the private column (None for records without the flag)
        private = group[(group["private"] == True) | group["target_epsilon"].notna()]  # noqa: E712
        if private.empty:
            curves[str(label)] = float(group[metric].mean())
            continue
        targeted = private[private["target_epsilon"].notna()]
        fixed = private[private["target_epsilon"].isna() & private["noise_multiplier"].notna()]
        points = [(float(eps), t_interval(g[metric].tolist()))
                  for eps, g in targeted.groupby("target_epsilon")]
        points += [(float(g["epsilon"].mean()), t_interval(g[metric].tolist()))
                   for _, g in fixed.groupby("noise_multiplier")]
        curves[str(label)] = sorted(points, key=lambda p: p[0])
    return curves


def privacy_utility(frame: pd.DataFrame, metric: str, path: Path) -> None:
    """Write metric vs epsilon: one line per method with its 95 % t band (``utility_curves``).

    Methods with only non-private runs are a dashed horizontal line at their mean.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for label, curve in utility_curves(frame, metric).items():
        if not isinstance(curve, list):
            ax.axhline(curve, ls="--", color="gray", label=label)
            continue
        eps = [e for e, _ in curve]
        line, = ax.plot(eps, [i.mean for _, i in curve], marker="o", label=label)
        ax.fill_between(eps, [i.low for _, i in curve], [i.high for _, i in curve],
                        color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xscale("log")
    ax.set_xlabel("epsilon (target; spent, for a fixed noise multiplier)")
    ax.set_ylabel(f"{metric} (mean, 95 % CI)")
    ax.set_title("privacy-utility")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def pareto(frame: pd.DataFrame, x: str, y: str, path: Path, title: str = "") -> None:
    """Write a scatter of ``y`` against ``x``, one colour per method, one point per run."""
    plt = _pyplot()
    ok = frame[frame["status"] == COMPLETED]
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    for label, group in ok.groupby("label"):
        if x in group and y in group:
            ax.scatter(group[x], group[y], label=str(label))
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel(y.replace("_", " "))
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


#: a verdict's colour in the forest plots
VERDICT_COLOURS = {"reproduced": "tab:green", "smaller than claimed": "tab:olive",
                   "contradicted": "tab:red", "underpowered": "tab:gray",
                   "failed runs": "tab:purple", "not run": "lightgray"}
_LIMIT = 6.0  # forest plots clip the scaled axis here (an arrow marks a clipped end)


def forest_points(rows: list[dict]) -> list[dict]:
    """Return one point per cell of each tested claim (thresholds are in the table only),
    on a scale where 0 is no effect and 1 the claim's target (or margin), coloured by the
    claim's verdict as the table states it (after Holm; a cell's own verdict, where it
    differs, is in its text)."""
    points = []
    for row in rows:
        if row.get("kind") == "threshold":
            continue
        for cell in row.get("cells", []):
            target = cell.get("target", float("nan"))
            if not (abs(target) > 0) or not cell.get("values") or len(cell["values"]) < 2 \
                    or math.isnan(cell["low"]) or math.isnan(cell["high"]):
                continue
            target = abs(target)
            label = row.get("id") or row["claim"][:40]
            points.append({
                "label": f"{label} ({cell['label']})" if cell.get("label") else label,
                "paper": row.get("paper", ""), "kind": row["kind"],
                "verdict": row["verdict"], "estimate": cell["estimate"] / target,
                "low": cell["low"] / target, "high": cell["high"] / target,
                "paper_effect": (cell["paper"] / target if row["kind"] in (
                    "superiority", "interaction") and cell["paper"] > target else None),
                "text": f"{cell['estimate']:.3f} [{cell['low']:.3f}, {cell['high']:.3f}], target "
                        f"{target:.3f}: {_verdicts(cell['verdict'], row['verdict'])}"})
    return points


def _verdicts(cell: str, claim: str) -> str:
    """Return the cell's verdict, and the claim's when a cell is one of several and differs."""
    return cell if cell == claim else f"{cell} (claim: {claim})"


def forest(points: list[dict], path: Path, title: str) -> None:
    """Write a forest plot of ``points`` (``forest_points``) to ``path`` (.png) and .pdf."""
    plt = _pyplot()
    n = len(points)
    height = 1.5 + 0.4 * max(n, 1)  # inches: 0.5 above the axes, 1.0 below, 0.4 a row
    fig, ax = plt.subplots(figsize=(12, height))
    fig.subplots_adjust(left=0.22, right=0.62, top=1 - 0.5 / height, bottom=1.0 / height)
    ax.axvline(0, color="black", lw=1)
    ax.axvline(1, color="tab:blue", lw=1, ls="--")
    for y, p in enumerate(reversed(points)):
        colour = VERDICT_COLOURS.get(p["verdict"], "black")
        low, high = max(p["low"], -_LIMIT), min(p["high"], _LIMIT)
        ax.plot([low, high], [y, y], color=colour, lw=2.5, solid_capstyle="butt")
        ax.plot([min(max(p["estimate"], -_LIMIT), _LIMIT)], [y], "o", color=colour, ms=6)
        for end, clipped, marker in ((low, p["low"] < -_LIMIT, "<"),
                                     (high, p["high"] > _LIMIT, ">")):
            if clipped:
                ax.plot([end], [y], marker, color=colour, ms=7)
        if p["kind"] == "equivalence":
            ax.fill_between([-1, 1], y - 0.35, y + 0.35, color="tab:blue", alpha=0.12, lw=0)
        if p["kind"] in ("equivalence", "non_inferiority"):
            ax.plot([-1], [y], "|", color="tab:blue", ms=14, mew=2)
        if p["paper_effect"] is not None:
            ax.plot([min(p["paper_effect"], _LIMIT)], [y], "D", color="black", ms=6,
                    mfc="none")
        ax.annotate(p["text"], xy=(1.02, y), xycoords=("axes fraction", "data"),
                    va="center", fontsize=8)
    ax.set_yticks(range(n), [p["label"] for p in reversed(points)], fontsize=8)
    ax.set_ylim(-0.7, n - 0.3)
    ax.set_xlim(-_LIMIT - 0.3, _LIMIT + 0.3)
    ax.set_xlabel("gain / target  (0: no effect; dashed 1: the target, or the margin; "
                  "diamond: the paper's number)", fontsize=8)
    ax.set_title(title, fontsize=10)
    handles = [plt.Line2D([], [], color=c, lw=2.5, label=v) for v, c in
               VERDICT_COLOURS.items() if any(p["verdict"] == v for p in points)]
    if handles:
        fig.legend(handles=handles, fontsize=8, loc="lower center", ncol=len(handles),
                   frameon=False, bbox_to_anchor=(0.45, 0.0))
    ax.grid(axis="x", alpha=0.3)
    save_figure(fig, path.with_suffix(".png"), dpi=110)
    save_figure(fig, path.with_suffix(".pdf"))
    plt.close(fig)


def forest_plots(rows: list[dict], out: Path) -> list[Path]:
    """Write ``forest_<paper>.png/.pdf`` per paper and ``forest_all.png/.pdf`` into ``out``;
    return the PNG paths (papers without a tested cell are skipped)."""
    written = []
    points = forest_points(rows)
    for key in dict.fromkeys(r.get("paper_key", r.get("paper", "")) for r in rows):
        mine = forest_points([r for r in rows if r.get("paper_key", r.get("paper", "")) == key])
        if mine:
            path = out / f"forest_{key}.png"
            forest(mine, path, f"{mine[0]['paper']}: gain [95 % CI]")
            written.append(path)
    if points:
        path = out / "forest_all.png"
        forest(points, path, "All claims: gain [95 % CI] / target")
        written.append(path)
    return written
