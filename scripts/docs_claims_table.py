"""Paste a reproduction's claims table into docs/tuning-and-claims.md (between the
``claims-table`` markers), generated from that run's ``claims/claims.md``, never typed.

    python scripts/docs_claims_table.py OUT [--note "what was run"]

OUT is the ``--out`` folder of ``dpbench-reproduce``; the header names it, the file's date
and the note (the command, the budget, what was not run).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "tuning-and-claims.md"
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--note", default="")
    p.add_argument("--doc", type=Path, default=DOC)
    args = p.parse_args()
    source = args.out / "claims" / "claims.md"
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(source.stat().st_mtime))
    block = (f"{START}\nGenerated from `{source.name}` of a run finished {stamp}. "
             f"{args.note}\n\n{table(source.read_text())}{END}")
    doc = args.doc.read_text()
    head, rest = doc.split(START, 1)
    _, tail = rest.split(END, 1)
    args.doc.write_text(head + block + tail)


if __name__ == "__main__":
    main()
