"""Print docs/sampling.md's two tables from the runs of ``dpbench-reproduce samplers``.

Every figure is read from a run's results.json (each record's epsilon re-derived from its own
ledger by ``dpbench.analysis.results.load_records``); each epsilon column holds one
neighbouring relation, so a row compares like with like only within a column group.

    dpbench-reproduce samplers --seeds 1,2 --out OUT
    python -m dpbench.analysis.sampling_tables OUT/reproduce/cpu/samplers
"""

from __future__ import annotations

import argparse
import datetime
import statistics
from typing import Any

from dpbench.analysis.results import load_records

SAMPLERS = (("poisson", "pld"), ("shuffle", "pld"), ("fixed_size", "rdp"))
SUFFIX = {"add_remove": "", "replace_one": "_replace_one", "zero_out": "_zero_out"}
OWN = {"poisson": "add_remove", "shuffle": "replace_one", "fixed_size": "replace_one"}


def _runs(records: list[dict[str, Any]], kind: str, sampler: str, relation: str
          ) -> list[dict[str, Any]]:
    if OWN[sampler] != relation and not SUFFIX[relation]:
        return []  # a sampler's own relation has no suffix; add/remove is Poisson's own
    suffix = "" if OWN[sampler] == relation else SUFFIX[relation]
    runs = [r for r in records if r["_sweep"] == f"{kind}_{sampler}{suffix}"]
    assert all(r["neighbouring"] == relation and r["sampler"] == sampler for r in runs), (
        f"{kind}_{sampler}{suffix}: a run under another sampler or relation")
    return runs


def _mean(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] if key in r else r.get("metrics", {}).get(key) for r in runs]
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def equal_noise(records: list[dict[str, Any]]) -> str:
    head = ("| sampler | accountant | add/remove: valid | replace-one: valid | replace-one: "
            "lower bound | zero-out: valid | zero-out: lower bound | add/remove: claimed as "
            "Poisson (NOT valid) | accuracy |\n|---|---|---|---|---|---|---|---|---|\n")
    rows = []
    for sampler, accountant in SAMPLERS:
        cells = {}
        for relation in SUFFIX:
            runs = _runs(records, "equal_noise", sampler, relation)
            cells[relation] = (_mean(runs, "epsilon"), _mean(runs, "epsilon_lower_bound"), runs)
        own = cells[OWN[sampler]][2]
        zero = _fmt(cells["zero_out"][0])
        if sampler == "poisson" and not cells["zero_out"][2]:
            zero = f"{_fmt(cells['add_remove'][0])} (= add/remove)"
        claimed = _mean(own, "epsilon_if_poisson")
        rows.append(f"| {sampler} | {accountant} | {_fmt(cells['add_remove'][0])} | "
                    f"{_fmt(cells['replace_one'][0])} | {_fmt(cells['replace_one'][1])} | "
                    f"{zero} | {_fmt(cells['zero_out'][1])} | "
                    f"{_fmt(claimed) if claimed is not None else '(= valid)'} | "
                    f"{_fmt(_mean(own, 'accuracy'), 3)} |")
    return head + "\n".join(rows)


def equal_epsilon(records: list[dict[str, Any]]) -> str:
    head = ("| sampler | accountant | add/remove: sigma, epsilon, accuracy | replace-one: "
            "sigma, epsilon, accuracy | replace-one: lower bound | zero-out: sigma, epsilon, "
            "accuracy | zero-out: lower bound | add/remove: claimed as Poisson (NOT valid) |\n"
            "|---|---|---|---|---|---|---|---|\n")
    rows = []
    for sampler, accountant in SAMPLERS:
        cells = {}
        for relation in SUFFIX:
            runs = _runs(records, "equal_epsilon", sampler, relation)
            if not runs:
                cells[relation] = "-"
                continue
            cells[relation] = (f"{_fmt(_mean(runs, 'noise_multiplier'))}, "
                               f"{_fmt(_mean(runs, 'epsilon'))}, "
                               f"{_fmt(_mean(runs, 'accuracy'), 3)}")
        if sampler == "poisson" and cells["zero_out"] == "-":
            cells["zero_out"] = f"{cells['add_remove']} (= add/remove)"
        lows = {r: _fmt(_mean(_runs(records, "equal_epsilon", sampler, r),
                              "epsilon_lower_bound")) for r in ("replace_one", "zero_out")}
        claimed = _mean(_runs(records, "equal_epsilon", sampler, OWN[sampler]),
                        "epsilon_if_poisson")
        rows.append(f"| {sampler} | {accountant} | {cells['add_remove']} | "
                    f"{cells['replace_one']} | {lows['replace_one']} | {cells['zero_out']} | "
                    f"{lows['zero_out']} | "
                    f"{_fmt(claimed) if claimed is not None else '(= valid)'} |")
    return head + "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", help="the samplers folder of dpbench-reproduce (one folder a sweep)")
    args = p.parse_args()
    records = load_records(args.root)
    seeds = sorted({r["seed"] for r in records})
    print(f"<!-- generated by dpbench.analysis.sampling_tables from {len(records)} runs (seeds "
          f"{', '.join(map(str, seeds))}) on {datetime.date.today().isoformat()} -->\n")
    print("At the same noise, sigma = 1.0:\n")
    print(equal_noise(records))
    print("\nAt the same valid epsilon, 3 (each cell's sigma calibrated by its accountant "
          "under its relation):\n")
    print(equal_epsilon(records))


if __name__ == "__main__":
    main()
