"""Steps-to-target (Dadsetan and Rudzicz 2025, docs/dp-lora-spectral.md).

The target is the baseline's final accuracy; a method's steps-to-target is the first
evaluated step at which its accuracy reaches it; the speed-up is 1 - steps / baseline steps;
the epsilon saved is the accountant's epsilon at the baseline's last step minus its epsilon at
the method's steps-to-target. Both are re-derived from each run's own ``privacy_ledger``
(``privacy.record_check.epsilon_after``), never read from its ``history`` or ``step_history``,
which anyone could edit; a run without a ledger has no epsilon saved (n/a).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from dpbench.analysis.results import load_records
from dpbench.privacy.record_check import LedgerMismatch, epsilon_after


def steps_to_target(step_history: Sequence[dict[str, Any]], target: float,
                    metric: str = "accuracy") -> dict[str, Any] | None:
    """Return the first row of ``step_history`` with ``metric >= target`` (None if never)."""
    for row in step_history:
        if row.get(metric) is not None and row[metric] >= target - 1e-12:
            return row
    return None


def curve(record: dict[str, Any], metric: str = "accuracy") -> list[dict[str, Any]]:
    """Return the run's evaluations over steps: ``step_history`` plus epoch-end rows, by step."""
    rows = {r["step"]: r for r in record.get("history", []) if r.get(metric) is not None}
    rows.update({r["step"]: r for r in record.get("step_history", [])})
    return [rows[k] for k in sorted(rows)]


def epsilon_at(record: dict[str, Any], step: int) -> float:
    """Return the epsilon ``record``'s ledger gives after ``step`` steps (NaN without a ledger
    that checks: an epsilon is re-derived, never read)."""
    try:
        return epsilon_after(record, int(step), str(record.get("_path", "results.json")))
    except (LedgerMismatch, TypeError, ValueError):
        return math.nan


def compare_to_baseline(baseline: dict[str, Any], method: dict[str, Any],
                        metric: str = "accuracy") -> dict[str, Any]:
    """Return steps-to-target, speed-up (%) and epsilon saved of ``method`` vs ``baseline``."""
    base_rows, method_rows = curve(baseline, metric), curve(method, metric)
    if not base_rows or not method_rows:
        raise ValueError("a run has no evaluations over steps (set trainer.eval_every_steps)")
    final = base_rows[-1]
    hit = steps_to_target(method_rows, final[metric], metric)
    out = {"target": final[metric], "baseline_steps": final["step"],
           "baseline_peak": max(r[metric] for r in base_rows),
           "method_peak": max(r[metric] for r in method_rows),
           "baseline_epsilon": epsilon_at(baseline, final["step"]),
           "method_final": method_rows[-1][metric], "reached": hit is not None}
    if hit is None:
        out.update(steps=math.nan, speedup_pct=math.nan, epsilon_saved=math.nan)
    else:
        out.update(steps=hit["step"], speedup_pct=100.0 * (1 - hit["step"] / final["step"]),
                   epsilon_saved=out["baseline_epsilon"] - epsilon_at(method, hit["step"]))
    return out


def saving(baseline: dict[str, Any], method: dict[str, Any],
           metric: str = "accuracy") -> tuple[float, bool] | None:
    """Return (share of steps saved, reached) of ``method`` against ``baseline``'s final
    ``metric``; None when a run has no evaluations over steps.

    A method that never reaches the target within the run is censored: its steps-to-target
    lies beyond the baseline's, so its saving is below 0 by an unknown amount, and 0 (its
    upper bound) is returned with ``reached`` False.
    """
    try:
        row = compare_to_baseline(baseline, method, metric)
    except ValueError:
        return None
    return (row["speedup_pct"] / 100.0 if row["reached"] else 0.0), bool(row["reached"])


def _key(record: dict[str, Any]) -> tuple[Any, Any]:
    cfg = record.get("config", {})
    privacy = cfg.get("privacy", {}).get("name", record.get("target_epsilon"))
    return privacy, cfg.get("seed")


def _method(record: dict[str, Any]) -> str:
    return record.get("config", {}).get("method", {}).get("name", "?")


def _mean_std(values: Iterable[float]) -> str:
    vals = [v for v in values if v == v]
    if not vals:
        return "n/a"
    std = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return f"{statistics.fmean(vals):.3g} +- {std:.2g}"


def summarise(records: Sequence[dict[str, Any]], baseline: str = "dplora",
              method: str = "spectral_denoise") -> list[dict[str, Any]]:
    """Return one row per privacy level: accuracies, speed-up and epsilon saved over seeds."""
    pairs: dict[Any, dict[Any, dict[str, dict]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        privacy, seed = _key(r)
        pairs[privacy][seed][_method(r)] = r
    rows = []
    for privacy, seeds in sorted(pairs.items(), key=lambda kv: str(kv[0])):
        results, base_acc, meth_acc, eps = [], [], [], []
        for runs in seeds.values():
            if baseline in runs and method in runs:
                results.append(compare_to_baseline(runs[baseline], runs[method]))
                base_acc.append(results[-1]["target"])
                meth_acc.append(results[-1]["method_final"])
                spent = (runs[method].get("epsilon"), runs[baseline].get("epsilon"))
                # an epsilon the reader could not derive (no ledger) is None: no saving
                eps.append(spent[0] - spent[1] if None not in spent else math.nan)
        if not results:
            continue
        rows.append({
            "privacy": privacy, "seeds": len(results),
            f"{baseline} final acc": _mean_std(base_acc),
            f"{method} final acc": _mean_std(meth_acc),
            f"{baseline} peak acc": _mean_std(r["baseline_peak"] for r in results),
            f"{method} peak acc": _mean_std(r["method_peak"] for r in results),
            "reached": f"{sum(r['reached'] for r in results)}/{len(results)}",
            "steps to target": _mean_std(r["steps"] for r in results),
            "baseline steps": _mean_std(r["baseline_steps"] for r in results),
            "speed-up %": _mean_std(r["speedup_pct"] for r in results),
            "epsilon saved": _mean_std(r["epsilon_saved"] for r in results),
            "max |epsilon diff| (final)": max(abs(e) for e in eps),
        })
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    """Print the steps-to-target table (markdown) for the runs under a sweep directory."""
    import argparse

    import pandas as pd

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="a sweep directory holding results.json files")
    parser.add_argument("--baseline", default="dplora")
    parser.add_argument("--method", default="spectral_denoise")
    args = parser.parse_args(argv)
    rows = summarise(load_records(args.root), args.baseline, args.method)
    print(pd.DataFrame(rows).to_markdown(index=False))


if __name__ == "__main__":
    main()
