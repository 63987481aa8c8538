"""Tables for scripts/reproduce_dp_ivon.sh: accuracy / NLL / ECE / Brier x epsilon, mean +- std.

Reads every completed ``results.json`` under the given folders, groups runs by method, batch
size, clip norm and target epsilon, and writes ``dp_ivon_tables.md`` and ``dp_ivon_runs.csv``
into ``--out``. Usage: python scripts/dp_ivon_table.py SWEEP_DIR [...] --out DIR
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

METRICS = ["accuracy", "nll", "ece", "brier"]
EXTRA = ["at_mean_accuracy", "at_mean_nll", "at_mean_ece", "vhat_zero_fraction"]


def load_runs(folders: list[Path]) -> pd.DataFrame:
    """Return one row per completed run: method, B, C, epsilon, seed and final metrics."""
    rows = []
    for folder in folders:
        for path in sorted(folder.rglob("results.json")):
            r = json.loads(path.read_text())
            if r.get("status") != "completed":
                continue
            cfg = r["config"]
            m = r["metrics"]
            row = {"method": r["method_name"], "batch_size": cfg["trainer"]["batch_size"],
                   "clip_norm": cfg["privacy"]["clip_norm"],
                   "target_epsilon": r.get("target_epsilon") or math.inf,
                   "epsilon": r["epsilon"], "seed": r["seed"], "steps": r["steps"],
                   "wall_time_s": r["wall_time_s"], "run": str(path.parent)}
            row.update({k: m.get(k) for k in METRICS + EXTRA})
            rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    key = ["method", "batch_size", "clip_norm", "target_epsilon", "seed"]
    return frame.drop_duplicates(subset=key, keep="first")  # a rerun in another folder


def mean_std(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Return a method x epsilon table of 'mean +- std (n)' for ``metric``."""
    groups = frame.groupby(["batch_size", "clip_norm", "method", "target_epsilon"])[metric]
    stats = groups.agg(["mean", "std", "count"]).reset_index()
    stats["cell"] = [f"{a:.4f} +- {0.0 if math.isnan(s) else s:.4f} ({n})"
                     for a, s, n in zip(stats["mean"], stats["std"], stats["count"])]
    return stats.pivot_table(index=["batch_size", "clip_norm", "method"],
                             columns="target_epsilon", values="cell", aggfunc="first")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    runs = load_runs(args.folders)
    if runs.empty:
        raise SystemExit("no completed results.json under " + " ".join(map(str, args.folders)))
    args.out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(args.out / "dp_ivon_runs.csv", index=False)
    parts = [f"# DP-IVON vs DP-SGD / DP-Adam ({len(runs)} runs; mean +- std over seeds, "
             "(n) = seeds; columns: target epsilon)\n"]
    for metric in METRICS + ["at_mean_accuracy", "at_mean_ece", "vhat_zero_fraction"]:
        if runs[metric].notna().any():
            table = mean_std(runs.dropna(subset=[metric]), metric).to_markdown()
            parts.append(f"## {metric}\n\n{table}\n")
    text = "\n".join(parts)
    (args.out / "dp_ivon_tables.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
