"""Markdown tables (mean +- std over seeds) from the FIBER reproduction's results.json files.

    python scripts/fiber_tables.py outputs/fiber [--out outputs/fiber/tables.md]

Reads every ``results.json`` under the folder (completed runs only) and writes: the
accuracy x epsilon table (one row per method), the ablation table (FIBER's filter and
correction settings) and, when ``bench.json`` is there, the wall-clock ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def _label(record: dict) -> str:
    method = record["config"]["method"]
    name = method["name"]
    if name != "fiber":
        return name
    s = method.get("settings", {})
    return f"fiber ({s.get('filter', 'innovation')}, {s.get('correction', 'filter_aware')})"


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    mean = 100 * statistics.fmean(values)
    std = 100 * statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.1f} +- {std:.1f} (n={len(values)})"


def collect(root: Path) -> dict[str, dict[float, list[dict]]]:
    """Return {label: {target epsilon: [records]}} for completed runs under ``root``."""
    table: dict[str, dict[float, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(root.rglob("results.json")):
        record = json.loads(path.read_text())
        if record.get("status") != "completed" or "config" not in record:
            continue
        table[_label(record)][record["target_epsilon"]].append(record)
    return table


def render(table, labels: list[str], title: str) -> list[str]:
    eps = sorted({e for lab in labels if lab in table for e in table[lab]})
    if not eps:
        return [f"### {title}", "", "(no completed runs)", ""]
    lines = [f"### {title}", "", "| method | grad evals / step | "
             + " | ".join(f"eps {e:g}" for e in eps) + " |", "|---|---|" + "---|" * len(eps)]
    for lab in labels:
        if lab not in table:
            continue
        cells = [_fmt([r["metrics"]["accuracy"] for r in table[lab].get(e, [])]) for e in eps]
        first = next(r for rs in table[lab].values() for r in rs)
        evals = first.get("method_summary", {}).get("gradient_evaluations_per_step", "?")
        lines.append(f"| {lab} | {evals} | " + " | ".join(cells) + " |")
    return lines + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    table = collect(args.root)
    main_rows = ["dpadamw", "disk", "dpadam_bc", "fiber (innovation, filter_aware)", "bandmf"]
    ablation = ["fiber (innovation, filter_aware)", "fiber (ema, filter_aware)",
                "fiber (innovation, standard)", "fiber (innovation, none)"]
    lines = ["Test accuracy (%), mean +- std over seeds.", ""]
    lines += render(table, main_rows, "Accuracy x epsilon")
    lines += render(table, ablation, "FIBER ablation")
    any_record = next((r for lab in table.values() for rs in lab.values() for r in rs), None)
    if any_record is not None:
        lines += ["Data: " + ("; ".join(any_record.get("data_notes", [])) or "official split"),
                  f"Steps per run: {any_record['steps']}, expected batch "
                  f"{any_record['expected_batch_size']:g}, N = {any_record['dataset_size']}.", ""]
    bench = args.root / "bench.json"
    if bench.is_file():
        b = json.loads(bench.read_text())
        lines += ["### Time per step relative to DP-AdamW (one process, interleaved)", "",
                  "| ratio | wall-clock | CPU time |", "|---|---|---|"]
        for name, r in b["ratios"].items():
            lines.append(f"| {name} | {r['wall']:.2f}x | {r['cpu']:.2f}x |")
        lines += ["", f"{b['reps']} interleaved repetitions of {b['steps']} steps after "
                  f"{b['warmup']} warm-up steps; medians; torch threads {b['threads']}.", ""]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
