"""The ROC curves of a run as data (``roc.csv``) and as a log-log plot (``roc.png``)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from dpbench.utils.io import atomic_write_bytes


def roc_csv(curves: dict[str, tuple[np.ndarray, np.ndarray]]) -> str:
    """Return ``attack,fpr,tpr`` rows, every threshold of every attack."""
    lines = ["attack,fpr,tpr"]
    for attack, (fpr, tpr) in curves.items():
        lines += [f"{attack},{f:.8g},{t:.8g}" for f, t in zip(fpr, tpr)]
    return "\n".join(lines) + "\n"


def write_roc(run_dir: Path, curves: dict[str, tuple[np.ndarray, np.ndarray]],
              aucs: dict[str, float], title: str) -> list[str]:
    """Write roc.csv and roc.png (log-log, the chance diagonal dashed); return their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    atomic_write_bytes(run_dir / "roc.csv", roc_csv(curves).encode())
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    # below the smallest FPR the examples resolve (1 / non-members) the curve says nothing
    positive = [f[f > 0].min() for f, _ in curves.values() if (f > 0).any()]
    floor = min(1e-3, min(positive, default=1e-3) / 2)
    for attack, (fpr, tpr) in curves.items():
        ax.plot(np.maximum(fpr, floor), np.maximum(tpr, floor),
                label=f"{attack} (AUC {aucs[attack]:.3f})")
    ax.plot([floor, 1], [floor, 1], "k--", lw=0.8, label="chance")
    ax.set(xscale="log", yscale="log", xlim=(floor, 1), ylim=(floor, 1),
           xlabel="false positive rate", ylabel="true positive rate", title=title)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(run_dir / "roc.png", buffer.getvalue())
    return ["roc.csv", "roc.png"]
