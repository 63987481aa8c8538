"""Paste a reproduction's claims table into docs/tuning-and-claims.md (between the
``claims-table`` markers), generated from that run's ``claims/claims.md``, never typed.

    python -m dpbench.analysis.docs_claims_table OUT [--note "what was run"]

OUT is the ``--out`` folder of ``dpbench-reproduce``; the header names it, the file's date
and the note (the command, the budget, what was not run). Below the table, for each claim
the run tested, the seeds a cell it used and what the old fixed design would have asked
from the same pilot (``old_hint``, read from ``claims/claims.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from dpbench.analysis.doc_block import splice
from dpbench.analysis.stats import ALPHA, sd_upper_bound, seeds_for_power

DOC = Path(__file__).resolve().parents[2] / "docs" / "tuning-and-claims.md"
START, END = "<!-- claims-table:start -->", "<!-- claims-table:end -->"


def table(claims_md: str) -> str:
    """Return the table and its counts line (the part above the legend)."""
    lines = claims_md.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| paper |"))
    last = first
    while last < len(lines) and lines[last].startswith("|"):
        last += 1
    counts = next((line for line in lines[last:] if line.strip()), "")
    return "\n".join(lines[first:last]) + "\n\n" + counts + "\n"


def old_hint(row: dict, family: int) -> int | None:
    """Return the seeds a cell the previous rules' hint asked from the claim's pilot: 80 %
    power of a fixed look at Holm's first level (alpha / family, one-sided) with each cell's
    spread at its 80 % chi-square upper bound, at the claimed effect (``stats.seeds_for_power``;
    equivalence: TOST at no difference). None beyond 1000 seeds or without a spread."""
    pilots = [[v for v, st in zip(c["values"], c.get("stages") or [1] * len(c["values"]))
               if st == 1] for c in row["cells"]]
    if not pilots or any(len(v) < 2 for v in pilots):
        return None
    sds = [sd_upper_bound(float(np.std(v, ddof=1)), len(v)) for v in pilots]
    cell = row["cells"][0]
    tost = row["kind"] == "equivalence"
    distance = abs(cell["target"]) if tost else abs(cell["paper"] - cell["target"])
    if not math.isfinite(distance) or distance <= 0:
        return None
    return seeds_for_power(sds, distance, ALPHA / 2 / max(1, family), tost=tost)


def comparison(rows: list[dict]) -> str:
    """Return a table of each tested claim's seeds a cell (pilot + follow-up) against the
    old hint's fixed design from the same pilot."""
    tested = [r for r in rows if r.get("verdict") != "not run"]
    if not tested:
        return ""
    lines = ["| paper | claim | verdict | seeds a cell used (pilot + follow-up) | "
             "old hint: seeds a cell of a fixed design |", "|---|---|---|---|---|"]
    for r in tested:
        family = sum(1 for x in rows if x.get("paper") == r.get("paper")
                     and not x.get("diagnostic"))
        n = old_hint(r, 1 if r.get("diagnostic") else family)
        lines.append(f"| {r.get('paper')} | {r['claim']} | {r['verdict']} | "
                     f"{r.get('design') or '—'} | {n if n is not None else '>1000 or —'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--note", default="")
    p.add_argument("--doc", type=Path, default=DOC)
    args = p.parse_args()
    source = args.out / "claims" / "claims.md"
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(source.stat().st_mtime))
    block = (f"{START}\nGenerated from `{source.name}` of a run finished {stamp}. "
             f"{args.note}\n\n{table(source.read_text())}")
    rows_file = args.out / "claims" / "claims.json"
    if rows_file.is_file():
        block += ("\nThe seeds each tested claim used, and the old hint from the same pilot "
                  "(`scripts/docs_claims_table.py`, `old_hint`):\n\n"
                  + comparison(json.loads(rows_file.read_text())))
    block += END
    args.doc.write_text(splice(args.doc.read_text(), block, START, END))


if __name__ == "__main__":
    main()
