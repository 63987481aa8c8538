"""The claims table as markdown: one claim a row, its legend and counts
(docs/tuning-and-claims.md, "The claims table")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dpbench.analysis.verdicts import VERDICTS


def number(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, str):
        return value
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def format_p(value: Any) -> str:
    """A p-value to 4 decimals (0.0496 and 0.0504 stay apart), below 1e-4 as "<0.0001"."""
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return "—"
    return "<0.0001" if value < 1e-4 else f"{value:.4f}"


def target_text(row: dict[str, Any]) -> str:
    """Return what the verdict compares with: the target effect, margin or threshold, and the
    claimed effect beyond it."""
    cells = [c for c in row.get("cells", []) if math.isfinite(c["target"])]
    targets = sorted({round(c["target"], 4) for c in cells})
    if not targets:
        return "—"
    kind = row["kind"]
    name = {"equivalence": "±", "non_inferiority": "> ", "threshold": "vs "}.get(kind, "> ")
    text = name + " / ".join(f"{t:g}" for t in targets)
    claimed = sorted({round(c["paper"], 4) for c in cells if math.isfinite(c["paper"])})
    if kind in ("superiority", "interaction", "threshold") and claimed:
        text += " (claimed " + " / ".join(f"{t:g}" for t in claimed) + ")"
    return text


def seeds_text(row: dict[str, Any]) -> str:
    """The seeds hint: "12 more (midway 45)" before a design's follow-up, "34 (midway 130)"
    for a fresh fixed look, "—" when none applies."""
    needed, midway = row.get("seeds_needed"), row.get("seeds_midway")
    if needed is None or needed == "—":
        return "spent (both looks run)" if row.get("hint") == "spent" else "—"
    more = " more" if row.get("hint") == "follow-up" else ""
    return f"{needed}{more} (midway {midway})"


def failure_text(row: dict[str, Any]) -> str:
    """The method's failure rate: "k/n [low, high]" (Clopper-Pearson), "0/n" without one."""
    n = row.get("expected_seeds", 0)
    if not n:
        return "—"
    parts = []
    for key, who in (("failed", ""), ("failed_baseline", "baseline ")):
        count = row.get(f"{key}_count", 0)
        if count or key == "failed":
            low, high = row.get(f"{key}_interval", (math.nan, math.nan))
            parts.append(f"{who}{count}/{n}" + (f" [{low:.2f}, {high:.2f}]" if count else ""))
    return "; ".join(parts)


def claims_markdown(rows: list[dict[str, Any]], figures: Sequence[str] = ()) -> str:
    """Return the claims table (one claim a row) with its legend, counts and figure links."""
    from dpbench.analysis.tables import markdown_text

    head = ("| paper | claim | kind | paper's number | target | dpbench gain [95 % CI] (n) "
            "| seeds (pilot + follow-up) | failed | P(A>B) | p (test) | adjusted p | BH q "
            "| verdict | seeds needed | notes | command |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for row in rows:
        verdict = row["verdict"] + (" †" if row.get("edge") else "")
        p_text = format_p(row.get("p")) + (f" ({row['p_test']})" if row.get("p_test")
                                           and math.isfinite(row.get("p", math.nan)) else "")
        cells = [row.get("paper", ""), row.get("claim", ""), row.get("kind", ""),
                 row.get("paper_value", ""), target_text(row), row.get("measured", ""),
                 row.get("design", "—"), failure_text(row),
                 number(row.get("p_improvement"), 2), p_text,
                 format_p(row.get("p_holm")), format_p(row.get("q_bh")), verdict,
                 seeds_text(row), "; ".join(row.get("notes", []))]
        lines.append("| " + " | ".join(markdown_text(str(c)) for c in cells)
                     + f" | `{row.get('command', '')}` |")
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    text = "\n".join(lines) + "\n\n" + ", ".join(f"{n} {v}" for v, n in counts.items()) + "\n"
    text += LEGEND
    if figures:
        text += "\nForest plots: " + ", ".join(f"[{Path(f).stem}]({f})" for f in figures) + "\n"
    return text


LEGEND = """
Verdicts (each paper's claims are one family: a false "reproduced" at most 2.5 %, and a false
"contradicted" or "smaller than claimed" at most 2.5 % together, so any wrong verdict in a
paper at most 5 %; the forest plots use the same colours):
- **reproduced**: the test for the claim rejects every gain up to the target (for
  equivalence: a gain outside the margin; non-inferiority: below minus the margin;
  threshold: on the wrong side).
- **smaller than claimed**: the paper's effect (or the declared smallest effect of
  interest) is rejected but not the target; for non-inferiority: worse than the baseline, not
  beyond the margin; equivalence: a difference is shown, not one beyond the margin;
  threshold: at most marginally on the claimed side.
- **contradicted**: the target and everything beyond it are rejected (equivalence: the gain
  lies outside the margin).
- **underpowered**: neither; the seeds needed say what would decide it.
- **failed runs**: the method's (or the baseline's) failure rate is shown above the claim's
  limit (its Clopper-Pearson interval wholly above `max_failure_rate`, default 5 %). Below
  it, a failed seed is data: each test imputes the least favourable gain its stage observed.
- **not run**: no runs yet.

Gain: method minus baseline paired by seed, signed so that positive is in the claim's favour
(baseline minus method for RMSE and ECE); its 95 % t interval over every seed (failed seeds
imputed, each end its least favourable value) is descriptive: the verdict reads the
design's p-values. Seeds: the pilot's and the follow-up's seeds a cell (failed ones
included); one number: a fixed look. Failed: the method's failed seeds of all seeds, with
the Clopper-Pearson 95 % interval. Target: the share of the paper's effect (or of the
declared effect) a superiority claim must exceed, with the claimed effect in brackets; the
margin of an equivalence or non-inferiority claim; a threshold's value. P(A>B): the share of
runs (seed and cell) on which the method wins. p (test): the design's p-value of the test
that decided (for: the claim; claimed effect: H0 the gain reaches the claimed effect;
against: H0 the gain reaches the target) on the two-sided scale: in a design min(pilot p /
s, combined p / (1 - s)), s about 5e-11 (O'Brien-Fleming-type), the follow-up's seeds combined
with the pilot's by the inverse-normal test; one fixed look: all seeds at the full alpha
(TOST for equivalence; an "at every" claim takes its largest cell p for, its smallest cell p
against times the cells). Each stage's test: a t test on Hall's skewness-removing
transformation. Adjusted p: that test adjusted within the paper; BH q:
Benjamini-Hochberg of the claims' p over the table (diagnostics excluded). Seeds needed: the
seeds a cell at which the claim is decided with 80 % assurance (power averaged over what the
pilot says about the spread) at the claimed effect, and at the effect midway between the
target and it; "more": the design's follow-up. A studentised bootstrap replaces the t test
for steps savings. † a learning rate was chosen at the edge of its grid in one of the
claim's cells: the verdict is provisional. Rules: docs/tuning-and-claims.md, "Verdict rules"
and "The design".
"""
