"""Figures from ``load_frame`` rows: privacy-utility curves with 95 % bands, Pareto scatters."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dpbench.analysis.stats import t_interval


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
    ok = frame[(frame["status"] == "completed")]
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
    fig.savefig(path, dpi=120)
    plt.close(fig)


def pareto(frame: pd.DataFrame, x: str, y: str, path: Path, title: str = "") -> None:
    """Write a scatter of ``y`` against ``x``, one colour per method, one point per run."""
    plt = _pyplot()
    ok = frame[frame["status"] == "completed"]
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
    fig.savefig(path, dpi=120)
    plt.close(fig)
