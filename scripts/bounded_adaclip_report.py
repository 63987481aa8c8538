"""Tables and Pareto plots of a bounded-adaptive-clipping sweep (reads every results.json).

    python scripts/bounded_adaclip_report.py outputs/bounded_adaclip_cpu

Writes ``table.md`` (mean +- std over seeds of macro, worst-class accuracy and accuracy parity,
plus demographic parity for tabular data; bounded minus each baseline in worst-class accuracy)
and ``pareto_<dataset>.png`` (macro vs worst-class accuracy; demographic parity vs accuracy).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

METHODS = ["bounded_adaclip", "adaclip", "autoclip", "dpsgd"]
LABELS = {"bounded_adaclip": "bounded adaptive", "adaclip": "unbounded adaptive",
          "autoclip": "AUTO-S", "dpsgd": "constant (normalised)"}
COLUMNS = ["macro_accuracy", "worst_class_accuracy", "accuracy_parity", "accuracy",
           "demographic_parity_gap"]


def load(out: Path) -> dict[str, dict[str, list[dict]]]:
    """Return dataset -> method -> completed records."""
    runs: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(out.rglob("results.json")):
        rec = json.loads(path.read_text())
        if rec.get("status") == "completed":
            runs[rec["dataset"]][rec["method_name"]].append(rec)
    return runs


def fmt(values: list[float]) -> str:
    std = np.std(values, ddof=1) if len(values) > 1 else 0.0
    return f"{100 * np.mean(values):.1f} +- {100 * std:.1f}"


def table(runs) -> str:
    lines = []
    for ds, by_method in runs.items():
        cols = [c for c in COLUMNS if any(c in r["metrics"] for rs in by_method.values()
                                          for r in rs)]
        lines += [f"### {ds}", "", "| method | seeds | epsilon | " + " | ".join(cols) + " |",
                  "|---" * (len(cols) + 3) + "|"]
        for m in METHODS:
            rs = by_method.get(m, [])
            if not rs:
                continue
            eps = max(r["epsilon"] for r in rs)
            cells = [fmt([r["metrics"][c] for r in rs]) for c in cols]
            lines.append(f"| {LABELS[m]} | {len(rs)} | {eps:.3f} | " + " | ".join(cells) + " |")
        b = by_method.get("bounded_adaclip", [])
        if b:
            def worst(rs: list[dict]) -> float:
                return float(np.mean([r["metrics"]["worst_class_accuracy"] for r in rs]))

            gains = [f"{LABELS[m]} {100 * (worst(b) - worst(by_method[m])):+.1f} pp"
                     for m in METHODS[1:] if by_method.get(m)]
            lines += ["", "bounded minus baseline, worst-class accuracy: " + ", ".join(gains)]
        lines.append("")
    return "\n".join(lines)


def pareto(runs, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for ds, by_method in runs.items():
        tabular = any("demographic_parity_gap" in r["metrics"] for rs in by_method.values()
                      for r in rs)
        x_key, y_key = (("demographic_parity_gap", "accuracy") if tabular
                        else ("macro_accuracy", "worst_class_accuracy"))
        fig, ax = plt.subplots(figsize=(4.5, 3.5))
        for m in METHODS:
            rs = by_method.get(m, [])
            if rs:
                ax.scatter([r["metrics"][x_key] for r in rs], [r["metrics"][y_key] for r in rs],
                           label=LABELS[m])
        ax.set_xlabel(x_key.replace("_", " "))
        ax.set_ylabel(y_key.replace("_", " "))
        ax.set_title(ds)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / f"pareto_{ds}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def main(out: str) -> None:
    root = Path(out)
    runs = load(root)
    text = table(runs)
    (root / "table.md").write_text(text)
    print(text)
    for p in pareto(runs, root):
        print(f"wrote {p}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "outputs/bounded_adaclip_cpu")
