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


def privacy_utility(frame: pd.DataFrame, metric: str, path: Path) -> None:
    """Write metric vs target epsilon: one line per method with its 95 % t band.

    Non-private runs are a dashed horizontal line at their mean.
    """
    plt = _pyplot()
    ok = frame[(frame["status"] == "completed")]
    ok = ok[ok[metric].notna()] if metric in ok else ok.iloc[0:0]
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for label, group in ok.groupby("label"):
        private = group[group["target_epsilon"].notna()]
        if private.empty:
            ax.axhline(group[metric].mean(), ls="--", color="gray", label=str(label))
            continue
        rows = [(eps, t_interval(g[metric].tolist()))
                for eps, g in private.groupby("target_epsilon")]
        eps = [e for e, _ in rows]
        line, = ax.plot(eps, [i.mean for _, i in rows], marker="o", label=str(label))
        ax.fill_between(eps, [i.low for _, i in rows], [i.high for _, i in rows],
                        color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xscale("log")
    ax.set_xlabel("target epsilon")
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
