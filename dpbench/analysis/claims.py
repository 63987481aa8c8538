"""The claims table: each paper claim as a declared test, its measurement and a verdict
(docs/tuning-and-claims.md, "The claims table" and "Verdict rules").

A claim is declared in ``conf/reproduce/<paper>.yaml`` and evaluated on the runs its
reproduction wrote. Every comparison is a *gain*: method minus baseline, paired by seed,
signed so that a positive gain is in the claim's favour (baseline minus method for metrics
where lower is better). Kinds:

- ``superiority``: the gain is positive and of the paper's size: ``paper_effect`` (the
  paper's number, in the metric's units) times ``fraction`` (default one half), or, when
  the paper gives no number, the smallest effect of interest ``effect`` (defaults by metric,
  ``METRIC_DEFAULTS``). ``statistic: steps_saving`` tests the share of steps saved to the
  baseline's final ``metric`` instead of the metric itself.
- ``non_inferiority``: the gain is above ``-margin``.
- ``equivalence``: the gain is within ``+-margin`` (TOST).
- ``threshold``: the mean of ``metric`` over the method's runs is ``above`` / ``below``
  ``threshold``.
- ``interaction``: the gain at ``contrast.values[0]`` minus the gain at ``contrast.values[1]``
  of the key ``contrast.key``, paired by seed, is positive and at least ``effect``.

``where`` selects runs (a list value is one cell per value: "at every epsilon"),
``method_where`` / ``baseline_where`` add conditions on one side, ``sweep`` restricts the
runs to the named sweep folders of the paper. ``margin_relative`` / ``effect_relative`` give a
margin or an effect as a share of the baseline's mean in the cell (RMSE). ``diagnostic:
true`` marks a precondition, kept out of the multiplicity families.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dpbench.analysis.stats import (
    ALPHA,
    benjamini_hochberg,
    higher_is_better,
    holm,
    one_sided_p,
    probability_of_improvement,
    seeds_for_power,
    seeds_for_tost,
    t_interval,
    tost,
)

KINDS = ("superiority", "non_inferiority", "equivalence", "threshold", "interaction")
VERDICTS = ("reproduced", "smaller than claimed", "contradicted", "underpowered", "not run")
#: the share of the paper's effect that a superiority claim must reach to be reproduced
FRACTION = 0.5
#: per metric: ``effect``, the smallest effect of interest of a claim whose paper gives no
#: number; ``margin``, the margin of non-inferiority and equivalence; ``*_relative``: as a
#: share of the baseline's mean. Each is justified in docs/tuning-and-claims.md ("Margins").
METRIC_DEFAULTS: dict[str, dict[str, float]] = {
    "accuracy": {"effect": 0.01, "margin": 0.01},
    "worst_class_accuracy": {"effect": 0.01, "margin": 0.01},
    "macro_accuracy": {"effect": 0.01, "margin": 0.01},
    "ece": {"effect": 0.01, "margin": 0.01},
    "rmse": {"effect_relative": 0.05, "margin_relative": 0.10},
    "mae": {"effect_relative": 0.05, "margin_relative": 0.10},
    "crps": {"effect_relative": 0.05, "margin_relative": 0.10},
}
#: the seed of the steps-saving null's resampling; each cell gets its own spawned stream
NULL_SEED = 0
NULL_DRAWS = 20000


class ClaimDataError(ValueError):
    """The runs a claim selects cannot be paired: more than one record for a (cell, seed,
    side), named by their files."""


def lookup(record: dict[str, Any], key: str) -> Any:
    """Return ``record[key]`` for a dotted key (``config.method.settings.filter``)."""
    value: Any = record
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _matches(record: dict[str, Any], where: dict[str, Any]) -> bool:
    for key, wanted in where.items():
        value = lookup(record, key)
        if isinstance(value, float) and isinstance(wanted, (int, float)):
            if not math.isclose(value, float(wanted)):
                return False
        elif value != wanted:
            return False
    return True


def select(records: Iterable[dict[str, Any]], method: str | None, where: dict[str, Any],
           sweeps: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Return the records of ``method`` matching ``where`` (and in ``sweeps``, if given)."""
    return [r for r in records if (method is None or r.get("method_name") == method)
            and (not sweeps or r.get("_sweep") in sweeps) and _matches(r, where)]


def _metric(record: dict[str, Any], metric: str) -> float | None:
    value = (record.get("metrics") or {}).get(metric, record.get(metric))
    if value is None and "." in metric:
        value = lookup(record, metric)  # e.g. method_summary.floor_binding_share
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def by_seed(records: list[dict[str, Any]], metric: str, what: str) -> dict[int, dict]:
    """Return the one record of each seed; ClaimDataError naming the files if a seed has more
    (two sweeps, or a rerun, matching one side of a cell: pairing would pick one by chance)."""
    out: dict[int, dict] = {}
    for r in records:
        seed = int(r["seed"])
        if seed in out:
            raise ClaimDataError(
                f"{what}: seed {seed} has more than one run: {out[seed].get('_path', '?')} and "
                f"{r.get('_path', '?')} (restrict the claim with 'sweep' or 'where')")
        out[seed] = r
    return {s: r for s, r in out.items() if _metric(r, metric) is not None} if metric else out


def _cells(where: dict[str, Any]) -> list[dict[str, Any]]:
    """Expand list-valued ``where`` entries into one cell per value (cartesian product)."""
    cells: list[dict[str, Any]] = [{}]
    for key, value in where.items():
        values = value if isinstance(value, list) else [value]
        cells = [{**c, key: v} for c in cells for v in values]
    return cells


def _cell_label(cell: dict[str, Any], where: dict[str, Any]) -> str:
    """Name the cell by the ``where`` keys that vary (list-valued) only."""
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in cell.items()
                     if isinstance(where.get(k), list))


# --- verdict rules on numbers (each tested on fixed numbers) -------------------------------

def superiority_verdict(low: float, high: float, estimate: float, target: float,
                        paper_effect: float) -> str:
    """Return the verdict of a gain with 95 % interval [low, high] against ``target`` (the
    share of the paper's effect that counts as reproducing it) and ``paper_effect``.

    reproduced: above 0, the estimate reaches the target; smaller than claimed: above 0, the
    estimate short of the target and the paper's effect ruled out; contradicted: below 0, or
    including 0 while short of the target (the claimed size ruled out); underpowered:
    otherwise (the interval holds both 0 and the target, or a positive gain of undecided
    size).
    """
    if high < 0 or (low <= 0 and high < target):
        return "contradicted"
    if low > 0 and estimate >= target:
        return "reproduced"
    if low > 0 and high < paper_effect:
        return "smaller than claimed"
    return "underpowered"


def non_inferiority_verdict(low: float, high: float, margin: float) -> str:
    """reproduced when the 95 % interval of the gain is above ``-margin``, contradicted when
    it is wholly below, underpowered otherwise."""
    if low > -margin:
        return "reproduced"
    if high < -margin:
        return "contradicted"
    return "underpowered"


def equivalence_verdict(low90: float, high90: float, margin: float) -> str:
    """reproduced when the 90 % interval lies inside (-margin, margin) (TOST at 5 %),
    contradicted when it lies wholly outside, underpowered otherwise."""
    if -margin < low90 and high90 < margin:
        return "reproduced"
    if low90 >= margin or high90 <= -margin:
        return "contradicted"
    return "underpowered"


def threshold_verdict(low: float, high: float, threshold: float, expect: str) -> str:
    """reproduced when the 95 % interval of the mean is wholly on the claimed side of
    ``threshold``, contradicted when wholly on the other side, underpowered otherwise."""
    above, below = low > threshold, high < threshold
    good, bad = (above, below) if expect == "above" else (below, above)
    return "reproduced" if good else "contradicted" if bad else "underpowered"


def combine_cells(verdicts: Sequence[str], p_against: Sequence[float]) -> str:
    """Return the verdict of a claim made "at every" cell: reproduced when every cell is;
    contradicted when a contradicted cell's p-value against the claim survives Holm across
    the cells; smaller than claimed when every cell is reproduced or smaller; underpowered
    otherwise."""
    if all(v == "reproduced" for v in verdicts):
        return "reproduced"
    adjusted = holm(p_against)
    if any(v == "contradicted" and p <= ALPHA for v, p in zip(verdicts, adjusted)):
        return "contradicted"
    if all(v in ("reproduced", "smaller than claimed") for v in verdicts):
        return "smaller than claimed"
    return "underpowered"


# --- evaluation ---------------------------------------------------------------------------

@dataclass
class CellResult:
    """One cell of a claim: the per-seed values the test uses and its outcome."""

    label: str
    values: list[float]           # per-seed gains (or metric values, threshold claims)
    low: float = math.nan         # the interval the verdict reads (95 %; 90 % for TOST)
    high: float = math.nan
    estimate: float = math.nan
    verdict: str = "not run"
    p_for: float = math.nan       # p-value of the claim's test (ALPHA scale)
    p_against: float = math.nan   # p-value of the contradiction test (ALPHA scale)
    seeds_needed: int | None = None
    target: float = math.nan      # the effect or margin the verdict compares with
    paper: float = math.nan       # the paper's number, in the same units
    notes: list[str] = field(default_factory=list)


def _defaults(claim: dict[str, Any], name: str) -> tuple[float | None, float | None]:
    """Return (absolute, relative) of ``effect`` or ``margin``: the claim's, else the metric's."""
    base = METRIC_DEFAULTS.get(claim["metric"].split(".")[-1], {})
    if f"{name}_relative" in claim:
        return None, float(claim[f"{name}_relative"])
    if name in claim:
        return float(claim[name]), None
    if name in base:
        return base[name], None
    if f"{name}_relative" in base:
        return None, base[f"{name}_relative"]
    return None, None


def _scaled(claim: dict[str, Any], name: str, baseline_mean: float) -> float:
    absolute, relative = _defaults(claim, name)
    if absolute is not None:
        return absolute
    if relative is not None:
        return relative * abs(baseline_mean)
    raise ValueError(f"claim {claim.get('id', claim['claim'])!r}: no {name} for metric "
                     f"{claim['metric']!r} (declare '{name}' or '{name}_relative')")


def _pairs(claim: dict[str, Any], records: list[dict[str, Any]], cell: dict[str, Any],
           label: str) -> tuple[dict[int, dict], dict[int, dict], list[str]]:
    sweeps = claim.get("sweep")
    sweeps = [sweeps] if isinstance(sweeps, str) else sweeps
    metric = claim["metric"] if claim.get("statistic") != "steps_saving" else ""
    what = f"claim {claim.get('id', claim['claim'])!r}, cell {label or 'all'}"
    mine = by_seed(select(records, claim["method"], {**cell, **claim.get("method_where", {})},
                          sweeps), metric, f"{what}, {claim['method']}")
    base = by_seed(select(records, claim["baseline"],
                          {**cell, **claim.get("baseline_where", {})}, sweeps),
                   metric, f"{what}, {claim['baseline']}")
    notes = []
    for side, have, other in ((claim["method"], mine, base), (claim["baseline"], base, mine)):
        if missing := sorted(set(other) - set(have)):
            notes.append(f"{label + ': ' if label else ''}{side} lacks seed(s) "
                         f"{', '.join(map(str, missing))}")
    return mine, base, notes


def _gains(claim: dict[str, Any], mine: dict[int, dict], base: dict[int, dict]) -> dict:
    sign = 1.0 if higher_is_better(claim["metric"].split(".")[-1]) else -1.0
    return {s: sign * (_metric(mine[s], claim["metric"]) - _metric(base[s], claim["metric"]))
            for s in sorted(set(mine) & set(base))}


def _difference_cell(claim: dict[str, Any], gains: Sequence[float], baseline_mean: float,
                     label: str) -> CellResult:
    """Test one cell's gains by the claim's kind (superiority, non-inferiority, equivalence)."""
    kind = claim["kind"]
    cell = CellResult(label, list(gains))
    interval = t_interval(gains)
    cell.estimate = interval.mean
    if interval.n < 2:
        cell.verdict = "underpowered" if interval.n else "not run"
        return cell
    sd = float(np.std(gains, ddof=1))
    if kind == "equivalence":
        cell.target = _scaled(claim, "margin", baseline_mean)
        ninety = t_interval(gains, level=1 - 2 * ALPHA)
        cell.low, cell.high = ninety.low, ninety.high
        cell.verdict = equivalence_verdict(cell.low, cell.high, cell.target)
        cell.p_for = tost(gains, -cell.target, cell.target)
        # contradicted: the 90 % interval wholly outside the margin (one side at 5 %)
        cell.p_against = min(one_sided_p(gains, cell.target, "greater"),
                             one_sided_p(gains, -cell.target, "less"))
        cell.seeds_needed = seeds_for_tost(sd, cell.target)
        return cell
    cell.low, cell.high = interval.low, interval.high
    if kind == "non_inferiority":
        cell.target = _scaled(claim, "margin", baseline_mean)
        cell.verdict = non_inferiority_verdict(cell.low, cell.high, cell.target)
        cell.p_for = min(1.0, 2 * one_sided_p(gains, -cell.target, "greater"))
        cell.p_against = min(1.0, 2 * one_sided_p(gains, -cell.target, "less"))
        cell.seeds_needed = seeds_for_power(sd, cell.target)
        return cell
    paper = claim.get("paper_effect")
    if paper is not None:
        cell.paper = float(paper)
        cell.target = float(claim.get("fraction", FRACTION)) * cell.paper
    else:
        cell.target = _scaled(claim, "effect", baseline_mean)
        cell.paper = cell.target
    cell.verdict = superiority_verdict(cell.low, cell.high, cell.estimate, cell.target,
                                       cell.paper)
    cell.p_for = min(1.0, 2 * one_sided_p(gains, 0.0, "greater"))
    cell.p_against = min(1.0, 2 * one_sided_p(gains, cell.target, "less"))
    cell.seeds_needed = seeds_for_power(sd, cell.target)
    return cell


def _threshold_cell(claim: dict[str, Any], values: Sequence[float], label: str) -> CellResult:
    cell = CellResult(label, list(values))
    interval = t_interval(values)
    cell.estimate, cell.low, cell.high = interval.mean, interval.low, interval.high
    cell.target = float(claim["threshold"])
    if interval.n < 2:
        cell.verdict = "underpowered" if interval.n else "not run"
        return cell
    expect = claim.get("expect", "above")
    side = "greater" if expect == "above" else "less"
    cell.verdict = threshold_verdict(cell.low, cell.high, cell.target, expect)
    cell.p_for = min(1.0, 2 * one_sided_p(values, cell.target, side))
    cell.p_against = min(1.0, 2 * one_sided_p(values, cell.target, "less" if side ==
                                              "greater" else "greater"))
    cell.seeds_needed = seeds_for_power(float(np.std(values, ddof=1)),
                                        abs(cell.estimate - cell.target))
    return cell


def _steps_cell(claim: dict[str, Any], mine: dict[int, dict], base: dict[int, dict],
                label: str, stream: np.random.SeedSequence) -> CellResult:
    """Steps saved per seed, less the mean saving of baseline-versus-baseline pairs (the
    first-crossing bias of a noisy curve), tested as a superiority gain."""
    from dpbench.analysis.steps_to_target import saving

    metric = claim["metric"]
    pairs = [saving(base[s], mine[s], metric) for s in sorted(set(mine) & set(base))]
    null_pairs = [saving(base[i], base[j], metric) for i in sorted(base) for j in sorted(base)
                  if i != j]
    observed = [v for v, _ in (p for p in pairs if p is not None)]
    null = [v for v, _ in (p for p in null_pairs if p is not None)]
    censored = sum(1 for p in pairs if p is not None and not p[1])
    null_censored = sum(1 for p in null_pairs if p is not None and not p[1])
    null_mean = float(np.mean(null)) if null else math.nan
    cell = _difference_cell({**claim, "kind": "superiority"},
                            [v - null_mean for v in observed], math.nan, label)
    cell.values = [v - null_mean for v in observed]
    prefix = f"{label}: " if label else ""
    if not observed:
        return cell
    cell.notes.append(
        f"{prefix}raw saving {np.mean(observed) if observed else math.nan:.3f}, "
        f"{censored}/{len(observed)} never reached; null of {len(null)} baseline pairs "
        f"({null_censored} never reached): mean {null_mean:.3f}, P(null mean of "
        f"{len(observed)} >= {cell.paper:.3f}) = "
        f"{null_exceeds(null, len(observed), cell.paper, stream):.2f}")
    return cell


def null_exceeds(null: Sequence[float], n: int, value: float,
                 stream: np.random.SeedSequence, draws: int = NULL_DRAWS) -> float:
    """Return P(mean of ``n`` draws from ``null`` >= ``value``) by resampling (its own stream)."""
    if not null or n < 1 or not math.isfinite(value):
        return math.nan
    rng = np.random.default_rng(stream)
    means = rng.choice(np.asarray(null, dtype=float), size=(draws, n)).mean(axis=1)
    return float(np.mean(means >= value - 1e-12))


def _interaction_gains(claim: dict[str, Any], records: list[dict[str, Any]]) -> tuple:
    """Return per seed the gain at the first contrast value minus the gain at the second,
    the two gaps by seed, the notes and the records used."""
    contrast = claim["contrast"]
    gaps, notes, used = [], [], []
    for value in contrast["values"]:
        cell = {**(claim.get("where") or {}), contrast["key"]: value}
        label = f"{contrast['key'].split('.')[-1]}={value}"
        mine, base, missing = _pairs(claim, records, cell, label)
        gaps.append(_gains(claim, mine, base))
        notes += missing
        used += list(mine.values()) + list(base.values())
    first, second = gaps
    seeds = sorted(set(first) & set(second))
    if dropped := sorted(set(first) ^ set(second)):
        notes.append(f"seed(s) {', '.join(map(str, dropped))} lack one of the two gaps")
    return [first[s] - second[s] for s in seeds], gaps, notes, used


def evaluate_claim(claim: dict[str, Any], records: list[dict[str, Any]],
                   seed: int = NULL_SEED) -> dict[str, Any]:
    """Return the claim with its cells, ``measured`` text, ``verdict``, ``p`` (its test, on
    the ALPHA scale), ``p_improvement``, ``seeds_needed`` and ``notes``; the multiplicity
    columns are added by ``adjust``."""
    kind = claim.get("kind", "superiority")
    if kind not in KINDS:
        raise ValueError(f"claim {claim.get('id', claim['claim'])!r}: unknown kind {kind!r} "
                         f"(known: {', '.join(KINDS)})")
    claim = {**claim, "kind": kind}
    where = claim.get("where") or {}
    cells: list[CellResult] = []
    notes: list[str] = []
    used: list[dict[str, Any]] = []
    if kind == "interaction":
        diffs, gaps, notes, used = _interaction_gains(claim, records)
        cell = _difference_cell({**claim, "kind": "superiority"}, diffs, math.nan,
                                "difference of gaps")
        cells.append(cell)
        gap_text = "; ".join(f"gap at {v}: {t_interval(list(g.values())).format(3)}"
                             for v, g in zip(claim["contrast"]["values"], gaps))
        notes.insert(0, gap_text)
    streams = np.random.SeedSequence(seed).spawn(max(1, len(_cells(where))))
    for cell_where, stream in zip(_cells(where), streams):
        if kind == "interaction":
            break
        label = _cell_label(cell_where, where)
        if kind == "threshold":
            runs = select(records, claim.get("method"), cell_where, _sweeps(claim))
            values = [v for r in runs if (v := _metric(r, claim["metric"])) is not None]
            cells.append(_threshold_cell(claim, values, label))
            used += runs
            continue
        mine, base, missing = _pairs(claim, records, cell_where, label)
        notes += missing
        used += list(mine.values()) + list(base.values())
        if claim.get("statistic") == "steps_saving":
            cells.append(_steps_cell(claim, mine, base, label, stream))
        else:
            gains = _gains(claim, mine, base)
            base_mean = float(np.mean([_metric(base[s], claim["metric"]) for s in gains])) \
                if gains else math.nan
            cells.append(_difference_cell(claim, list(gains.values()), base_mean, label))
        notes += cells[-1].notes
    if not any(c.values for c in cells):
        verdict = "not run"
    elif len(cells) == 1:
        verdict = cells[0].verdict
    else:
        verdict = combine_cells([c.verdict for c in cells], [c.p_against for c in cells])
    edge = sorted({f"{r.get('method_name')} {_cell_text(r)}" for r in used
                   if (lookup(r, "tuning.at_grid_edge") is True)})
    if edge:
        notes.append("learning rate at the grid's edge: " + ", ".join(edge))
    gains = [v for c in cells for v in c.values] if kind != "threshold" else []
    if missing_cells := [c.label or "all" for c in cells if not c.values]:
        notes.append(f"no runs yet: {', '.join(missing_cells)}")
    return {**claim, "cells": [c.__dict__ for c in cells],
            "measured": _measured(cells, claim.get("digits", 3)) or "no runs",
            "verdict": verdict, "edge": bool(edge),
            # the claim holds only if every cell does: its p-value is the largest (IUT)
            "p": max((c.p_for for c in cells), default=math.nan)
            if all(math.isfinite(c.p_for) for c in cells) else math.nan,
            "p_improvement": probability_of_improvement(gains) if gains else math.nan,
            "seeds_needed": (None if verdict in ("reproduced", "smaller than claimed",
                                                 "contradicted", "not run")
                             else _max_needed([c.__dict__ for c in cells])),
            "notes": notes}


def _sweeps(claim: dict[str, Any]) -> list[str] | None:
    sweeps = claim.get("sweep")
    return [sweeps] if isinstance(sweeps, str) else sweeps


def _cell_text(record: dict[str, Any]) -> str:
    eps = record.get("target_epsilon")
    return f"eps={eps:g}" if isinstance(eps, (int, float)) else "(no target)"


def _max_needed(cells: Sequence[dict[str, Any]]) -> int | str:
    """Return the most seeds any undecided cell with at least two pairs needs (">1000" when
    one is out of reach, "—" when no cell can say)."""
    needed = [c["seeds_needed"] for c in cells if len(c["values"]) >= 2
              and c["verdict"] not in ("reproduced", "smaller than claimed")]
    if any(n is None for n in needed):
        return ">1000"
    return max(needed, default="—")


def _measured(cells: Sequence[CellResult], digits: int) -> str:
    parts = []
    for c in cells:
        if not c.values:
            parts.append(f"{c.label}: no pairs".lstrip(": "))
            continue
        if len(c.values) < 2:
            text = f"{c.estimate:.{digits}f} (n=1)"
        else:
            text = (f"{c.estimate:.{digits}f} [{c.low:.{digits}f}, {c.high:.{digits}f}] "
                    f"(n={len(c.values)})")
        parts.append(f"{c.label}: {text}".lstrip(": "))
    return "; ".join(parts)


def adjust(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return ``rows`` with ``p_holm`` (Holm within each paper) and ``q_bh`` (Benjamini-
    Hochberg over the table), diagnostics left out of both; a reproduced or smaller-than-
    claimed verdict whose Holm p exceeds ALPHA becomes underpowered."""
    tested = [i for i, r in enumerate(rows) if not r.get("diagnostic")
              and math.isfinite(r.get("p", math.nan))]
    q = benjamini_hochberg([rows[i]["p"] for i in tested])
    out = [{**r, "p_holm": math.nan, "q_bh": math.nan} for r in rows]
    for i, value in zip(tested, q):
        out[i]["q_bh"] = value
    for paper in dict.fromkeys(r.get("paper") for r in rows):
        family = [i for i in tested if rows[i].get("paper") == paper]
        for i, value in zip(family, holm([rows[i]["p"] for i in family])):
            out[i]["p_holm"] = value
            if out[i]["verdict"] in ("reproduced", "smaller than claimed") and value > ALPHA:
                out[i]["notes"] = [*out[i]["notes"], f"{out[i]['verdict']} before Holm "
                                   f"(Holm p {value:.3f} > {ALPHA})"]
                out[i]["verdict"] = "underpowered"
                out[i]["seeds_needed"] = _max_needed(
                    [{**c, "verdict": "underpowered"} for c in out[i]["cells"]])
    return out


def _number(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, str):
        return value
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _p(value: Any) -> str:
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return "—"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def target_text(row: dict[str, Any]) -> str:
    """Return what the verdict compares with: the target effect, margin or threshold."""
    targets = sorted({round(c["target"], 4) for c in row.get("cells", [])
                      if math.isfinite(c["target"])})
    if not targets:
        return "—"
    name = {"equivalence": "±", "non_inferiority": "> −", "threshold": "vs "}.get(
        row["kind"], "≥ ")
    return name + " / ".join(f"{t:g}" for t in targets)


def claims_markdown(rows: list[dict[str, Any]], figures: Sequence[str] = ()) -> str:
    """Return the claims table (one claim a row) with its legend, counts and figure links."""
    from dpbench.analysis.tables import markdown_text

    head = ("| paper | claim | kind | paper's number | target | dpbench gain [95 % CI] (n) "
            "| P(A>B) | p | Holm p | BH q | verdict | seeds needed | notes | command |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for row in rows:
        verdict = row["verdict"] + (" †" if row.get("edge") else "")
        cells = [row.get("paper", ""), row.get("claim", ""), row.get("kind", ""),
                 row.get("paper_value", ""), target_text(row), row.get("measured", ""),
                 _number(row.get("p_improvement"), 2), _p(row.get("p")),
                 _p(row.get("p_holm")), _p(row.get("q_bh")), verdict,
                 _number(row.get("seeds_needed")), "; ".join(row.get("notes", []))]
        lines.append("| " + " | ".join(markdown_text(str(c)) for c in cells)
                     + f" | `{row.get('command', '')}` |")
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    text = "\n".join(lines) + "\n\n" + ", ".join(f"{n} {v}" for v, n in counts.items()) + "\n"
    text += LEGEND
    if figures:
        text += "\nForest plots: " + ", ".join(f"[{Path(f).stem}]({f})" for f in figures) + "\n"
    return text


LEGEND = """
Gain: method minus baseline paired by seed, signed so that positive is in the claim's favour
(baseline minus method for RMSE and ECE); 90 % interval for equivalence (TOST). Target: the
share of the paper's effect (or the smallest effect of interest) a superiority claim must
reach, the margin of an equivalence or non-inferiority claim, a threshold's value. P(A>B):
the share of seeds on which the method wins. p: the claim's test (one-sided, doubled; TOST
for equivalence; an "at every" claim takes its largest cell p). Holm p: adjusted within the
paper; BH q: Benjamini-Hochberg over the table (diagnostics excluded). Seeds needed: per cell,
for 80 % power at the target from the observed spread (undecided claims). † a learning rate
was chosen at the edge of its grid in one of the claim's cells: the verdict is provisional.
Rules: docs/tuning-and-claims.md, "Verdict rules".
"""
