"""Tables and the gradient-tail figure of a DP-aware AdaLN-Zero sweep (reads results.json).

    python scripts/dp_adaln_report.py outputs/dp_adaln/cpu
writes ``table.md`` (metrics by method x noise, mean +- std over seeds; g_cond tail
quantiles, clip rate and severity) and ``g_cond_hist.png`` into the sweep folder. The gradient
diagnostics come from results.json's ``private_diagnostics``: they are computed on the
training data without noise, so the table and figure are for the data owner, not to publish.
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

METRICS = ("rmse", "mae", "mape", "crps", "js", "acf_distance")
DIAG = ("g_cond_p50", "g_cond_p90", "g_cond_p99", "g_cond_max", "g_rest_p50", "g_rest_p99",
        "clip_rate", "clip_severity")


def load(root: Path) -> dict[tuple[str, float], list[dict]]:
    """Return completed records grouped by (method, sigma); sigma 0 = non-private."""
    groups: dict[tuple[str, float], list[dict]] = defaultdict(list)
    for path in sorted(root.rglob("results.json")):
        r = json.loads(path.read_text())
        if r.get("status") != "completed":
            continue
        sigma = float(r["noise_multiplier"] or 0.0) if r.get("private") else 0.0
        groups[(r["method_name"], sigma)].append(r)
    return groups


def diagnostics(record: dict) -> dict:
    """Return the run's final un-privatised training diagnostics (empty if none)."""
    return (record.get("private_diagnostics") or {}).get("final") or {}


def cell(values: list[float], digits: int = 3) -> str:
    v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if not len(v):
        return "n/a"
    return f"{v.mean():.{digits}f} +- {v.std(ddof=1) if len(v) > 1 else 0.0:.{digits}f}"


def tables(groups) -> str:
    keys = sorted(groups, key=lambda k: (k[1], k[0]))
    lines = ["| method | sigma | epsilon | seeds | " + " | ".join(METRICS) + " |",
             "|" + "---|" * (4 + len(METRICS))]
    for method, sigma in keys:
        rs = groups[(method, sigma)]
        eps = rs[0]["epsilon"]
        lines.append(f"| {method} | {sigma if sigma else 'non-private'} | "
                     f"{'inf' if eps is None or not math.isfinite(eps) else round(eps, 2)} | "
                     f"{len(rs)} | "
                     + " | ".join(cell([r["metrics"].get(m) for r in rs]) for m in METRICS)
                     + " |")
    lines += ["", "Training gradient diagnostics (NOT privatised: do not publish):", "",
              "| method | sigma | " + " | ".join(DIAG) + " |", "|" + "---|" * (2 + len(DIAG))]
    for method, sigma in keys:
        if not sigma:
            continue
        rs = groups[(method, sigma)]
        lines.append(f"| {method} | {sigma} | "
                     + " | ".join(cell([diagnostics(r).get(m) for r in rs]) for m in DIAG)
                     + " |")
    lines += ["", "DP-aware vs DP-vanilla (mean RMSE over seeds, lower is better):"]
    for sigma in sorted({s for _, s in keys}):
        a, v = groups.get(("dp_adaln", sigma)), groups.get(("dp_vanilla", sigma))
        if a and v:
            ma = np.mean([r["metrics"]["rmse"] for r in a])
            mv = np.mean([r["metrics"]["rmse"] for r in v])
            va = {r["seed"]: r["metrics"]["rmse"] for r in a}
            vv = {r["seed"]: r["metrics"]["rmse"] for r in v}
            diffs = [va[k] - vv[k] for k in sorted(set(va) & set(vv))]
            lines.append(f"- sigma {sigma or 'non-private'}: dp_adaln {ma:.3f} vs dp_vanilla "
                         f"{mv:.3f} -> ratio {ma / mv:.3f}; paired per-seed difference "
                         f"{cell(diffs)} over {len(diffs)} seeds "
                         f"({'DP-aware better' if ma < mv else 'DP-aware NOT better'})")
    return "\n".join(lines) + "\n"


def figure(groups, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sigmas = sorted({s for _, s in groups if s})
    if not sigmas:
        return
    fig, axes = plt.subplots(1, len(sigmas), figsize=(4 * len(sigmas), 3.2), squeeze=False)
    for ax, sigma in zip(axes[0], sigmas):
        for method, color in (("dp_vanilla", "tab:red"), ("dp_adaln", "tab:blue")):
            norms = [v for r in groups.get((method, sigma), [])
                     for v in diagnostics(r).get("g_cond_norms", [])]
            if norms:
                ax.hist(norms, bins=50, alpha=0.5, color=color, label=method, log=True)
        ax.set_title(f"sigma = {sigma}")
        ax.set_xlabel("per-example ||g_cond|| (all steps)")
    axes[0][0].set_ylabel("count (log)")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    root = Path((argv or sys.argv[1:] or ["outputs/dp_adaln/cpu"])[0])
    groups = load(root)
    if not groups:
        sys.exit(f"no completed results.json under {root}")
    text = tables(groups)
    (root / "table.md").write_text(text)
    figure(groups, root / "g_cond_hist.png")
    print(text)
    print(f"wrote {root / 'table.md'} and {root / 'g_cond_hist.png'}")


if __name__ == "__main__":
    main()
