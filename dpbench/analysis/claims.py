"""The claims table: each paper claim as a declared test, its measurement and a verdict
(docs/tuning-and-claims.md, "The claims table", "Verdict rules" and "The design").

A claim is declared in ``conf/reproduce/<paper>.yaml`` (``claim_spec``: kinds, sizes, the
checks) and evaluated here on the runs its reproduction wrote. Every comparison is a *gain*:
method minus baseline, paired by seed, signed so that a positive gain is in the claim's
favour (baseline minus method for metrics where lower is better). Kinds: ``superiority``
(``statistic: steps_saving`` tests the share of steps saved), ``non_inferiority``,
``equivalence``, ``threshold`` and ``interaction`` (docs, "Declared claims").

Each cell's tests are one-sided tests of the mean gain, taken per stage of the paper's
design (``design``: a pilot and a follow-up, combined by the inverse-normal test; without a
design, one fixed look at the full alpha). A seed without a usable run on a side is a failed
seed: each test imputes for it the least favourable gain observed in its stage (the
smallest for a test for the claim, the largest for a test against it), and a failure rate
whose Clopper-Pearson interval lies wholly above ``max_failure_rate`` reads "failed runs".
The verdicts within a paper: ``verdicts.family_p``; the table: ``claims_table``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from dpbench.analysis.claim_spec import (
    FAILURE_LIMIT,
    FRACTION,
    KINDS,
    METRIC_DEFAULTS,
    THRESHOLD_TOLERANCE,
    ClaimSpecError,
    cell_label,
    claim_name,
    claim_sweeps,
    edges,
    expand_cells,
    lookup,
    metric_value,
    select,
    validate_claim,
)
from dpbench.analysis.claims_table import LEGEND, claims_markdown, format_p, target_text
from dpbench.analysis.design import (
    STAGE_SKEW_FLOOR,
    Stages,
    design_p,
    failure_interval,
    fixed_seeds,
    follow_up_seeds,
)
from dpbench.analysis.stats import (
    ALPHA,
    SKEW_SHIFT_MIN_N,
    benjamini_hochberg,
    higher_is_better,
    one_sided_q,
    probability_of_improvement,
    t_interval,
)
from dpbench.analysis.verdicts import (
    AGAINST,
    MIN_VALUES,
    VERDICTS,
    cells_p,
    decide,
    equivalence_verdict,
    family_p,
    non_inferiority_verdict,
    superiority_verdict,
    threshold_verdict,
)

__all__ = ["AGAINST", "FAILURE_LIMIT", "FRACTION", "KINDS", "LEGEND", "METRIC_DEFAULTS",
           "THRESHOLD_TOLERANCE", "VERDICTS", "CellResult", "ClaimDataError",
           "ClaimSpecError", "adjust", "claims_markdown", "decide", "equivalence_verdict",
           "evaluate_claim", "lookup", "non_inferiority_verdict", "select",
           "superiority_verdict", "target_text", "threshold_verdict", "validate_claim"]

#: the fewest values a studentised bootstrap is run on (below it, too few distinct
#: resamples for its tails)
BOOTSTRAP_MIN_VALUES = 6
#: the seed of the bootstrap's and the steps null's resampling; each cell its own stream
NULL_SEED = 0
NULL_DRAWS = 20000


class ClaimDataError(ValueError):
    """The runs a claim selects cannot be paired: more than one record for a (cell, seed,
    side), named by their files."""


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
    return {s: r for s, r in out.items()
            if metric_value(r, metric) is not None} if metric else out


@dataclass
class CellResult:
    """One cell of a claim: the per-seed values the tests use and their outcome."""

    label: str
    values: list[float]           # per-seed gains (or metric values, threshold claims)
    seeds: list[int] = field(default_factory=list)    # the seed of each value
    stages: list[int] = field(default_factory=list)   # the design stage of each value (1, 2)
    low: float = math.nan         # the 95 % interval shown (failures imputed, each end its
    high: float = math.nan        # least favourable)
    estimate: float = math.nan
    verdict: str = "not run"
    p_for: float = math.nan       # H0: the gain is at most the target (ALPHA scale)
    p_against: float = math.nan   # H0: the gain is at least the target
    p_smaller: float = math.nan   # H0: the gain is at least the claimed effect
    q1_for: float = math.nan      # the pilot's one-sided p of the test for the claim
    q1_low: float = math.nan      # equivalence: the pilot's one-sided p against the lower
    q1_high: float = math.nan     # margin, and against the upper one
    pilot_margin: float = math.nan  # the pilot's 97.5 % lower bound of the gain less the target
    target: float = math.nan      # the effect, margin or threshold the verdict compares with
    paper: float = math.nan       # the claimed effect (the paper's, or the declared one)
    sd: float = math.nan          # the pilot's spread (the seeds hint)
    n_pilot: int = 0              # seeds of the pilot (failed ones included)
    n_follow_up: int = 0          # seeds of the follow-up (failed ones included)
    exact: bool = False           # a studentised bootstrap, not the t test, decided
    failed: list[int] = field(default_factory=list)   # seeds whose method run failed
    failed_baseline: list[int] = field(default_factory=list)
    failed_stages: list[int] = field(default_factory=list)  # the stage of each failed seed
    expected: int = 0             # the seeds the cell should have
    notes: list[str] = field(default_factory=list)


# --- one cell's tests -----------------------------------------------------------------------

def _stage_q(x: np.ndarray, failed: int, null: float, alternative: str, bootstrap: bool,
             rng: np.random.Generator | None, floor: float = SKEW_SHIFT_MIN_N) -> float:
    """One stage's one-sided p: each failed seed imputed with the least favourable value the
    stage observed (the smallest for ``greater``, the largest for ``less``); ``floor``: the
    skewness offset's (``stats.skew_offset``; a design's stages: ``STAGE_SKEW_FLOOR``)."""
    if failed and len(x):
        x = np.concatenate([x, np.full(failed, x.min() if alternative == "greater"
                                       else x.max())])
    if len(x) < (BOOTSTRAP_MIN_VALUES if bootstrap else MIN_VALUES):
        return math.nan
    return float(one_sided_q(x, null, alternative, bootstrap=bootstrap, rng=rng, floor=floor))


def _test(cell: CellResult, target: float, claimed: float, *, equivalence: bool = False,
          exact: bool = False, sign: float = 1.0, design: bool = False,
          rng: np.random.Generator | None = None) -> CellResult:
    """Fill ``cell``'s interval, p-values and verdict from its values (``sign`` -1 tests the
    negated values: a threshold expected below). Per stage a t test, or the studentised
    bootstrap when ``exact``; with ``design`` the stages are combined (``design.design_p``),
    without it the cell is one look at the full alpha (docs "Verdict rules")."""
    x = sign * np.asarray(cell.values, dtype=float)
    stage = np.asarray(cell.stages or [1] * len(x))
    fails = np.asarray(cell.failed_stages, dtype=int)
    cell.target, cell.paper = sign * target, sign * claimed
    cell.exact = bool(exact)
    cell.n_pilot = int(np.sum(stage == 1) + np.sum(fails == 1))
    cell.n_follow_up = int(np.sum(stage == 2) + np.sum(fails == 2))
    if len(x):
        cell.estimate = float(np.mean(cell.values))
    pilot = x[stage == 1] if design else x
    if len(pilot) >= 2:
        cell.sd = float(np.std(pilot, ddof=1))
    if len(x) + len(fails) < MIN_VALUES or len(x) < 2:
        cell.verdict = "underpowered" if len(x) else "not run"
        return cell

    def q(null: float, alternative: str, first_only: bool = False) -> float:
        if not design:
            return _stage_q(x, len(fails), null, alternative, exact, rng)
        q1, q2 = (_stage_q(x[stage == s], int(np.sum(fails == s)), null, alternative, exact,
                           rng, STAGE_SKEW_FLOOR) for s in (1, 2))
        if first_only:
            return q1
        return float(design_p(q1, q2))

    if equivalence:
        margin = target
        cell.p_for = min(1.0, 2 * max(q(-margin, "greater"), q(margin, "less")))
        cell.p_against = min(1.0, 2 * min(q(margin, "greater"), q(-margin, "less")))
        # a difference in either direction: two one-sided tests, Bonferroni (2.5 % in all)
        cell.p_smaller = min(1.0, 4 * min(q(0.0, "greater"), q(0.0, "less")))
        if design:
            cell.q1_low = q(-margin, "greater", first_only=True)
            cell.q1_high = q(margin, "less", first_only=True)
    else:
        cell.p_for = min(1.0, 2 * q(target, "greater"))
        cell.p_against = min(1.0, 2 * q(target, "less"))
        cell.p_smaller = min(1.0, 2 * q(claimed, "less"))
        cell.q1_for = q(target, "greater", first_only=True) if design else math.nan
        if design and len(pilot) >= 2:
            cell.pilot_margin = pilot_lower_bound(pilot) - target
    # the claimed effect lies beyond the target (equivalence: outside the margin is a
    # difference): rejecting the larger hypothesis rejects the one inside it
    cell.p_smaller = float(np.fmin(cell.p_smaller, cell.p_against))
    worst = np.concatenate([x, np.full(len(fails), x.min())])
    best = np.concatenate([x, np.full(len(fails), x.max())])
    low, high = t_interval(worst, 1 - ALPHA).low, t_interval(best, 1 - ALPHA).high
    cell.low, cell.high = (low, high) if sign > 0 else (-high, -low)
    cell.verdict = decide(cell.p_for, cell.p_against, cell.p_smaller)
    return cell


def pilot_lower_bound(x: np.ndarray) -> float:
    """The one-sided 97.5 % t lower bound of the mean of the pilot's observed values."""
    return float(np.mean(x) - stats.t.ppf(0.975, len(x) - 1) * np.std(x, ddof=1)
                 / math.sqrt(len(x)))


def _difference_cell(claim: dict[str, Any], cell: CellResult, baseline_mean: float, *,
                     exact: bool = False, design: bool = False,
                     rng: np.random.Generator | None = None) -> CellResult:
    """Test one cell's gains by the claim's kind (superiority, non-inferiority, equivalence,
    interaction)."""
    if not cell.values:
        return cell
    target, claimed = edges(claim, baseline_mean)
    return _test(cell, target, claimed, equivalence=claim["kind"] == "equivalence",
                 exact=exact, design=design, rng=rng)


def _threshold_cell(claim: dict[str, Any], cell: CellResult, design: bool) -> CellResult:
    threshold = float(claim["threshold"])
    tolerance = float(claim.get("tolerance", THRESHOLD_TOLERANCE * abs(threshold)))
    sign = 1.0 if claim.get("expect", "above") == "above" else -1.0
    cell = _test(cell, sign * threshold, sign * threshold + tolerance, sign=sign,
                 design=design)
    cell.paper = threshold + sign * tolerance
    return cell


# --- the runs of a cell -----------------------------------------------------------------------

@dataclass
class _Side:
    usable: dict[int, dict]       # seed -> the record with a usable value
    failed: list[int]             # seeds expected without one


def _sides(claim: dict[str, Any], records: list[dict[str, Any]],
           everything: list[dict[str, Any]], cell: dict[str, Any], label: str,
           stages: Stages | None, metric: str) -> tuple[_Side, _Side, list[str]]:
    """Return the method's and the baseline's runs of a cell: usable records by seed and the
    failed seeds (a failed run, one without a finite metric, or, for a seed expected in the
    cell, none at all: the design's seeds, or without a design every seed either side has)."""
    what = f"claim {claim_name(claim)!r}, cell {label or 'all'}"
    sweeps = claim_sweeps(claim)
    out, seen = [], set()
    for name, extra in ((claim["method"], "method_where"), (claim["baseline"], "baseline_where")):
        where = {**cell, **claim.get(extra, {})}
        usable = by_seed(select(records, name, where, sweeps), metric, f"{what}, {name}")
        anything = {int(r["seed"]) for r in select(everything, name, where, sweeps)
                    if "seed" in r}
        out.append((usable, anything))
        seen |= anything | set(usable)
    # a cell nobody ran is "not run", not failed on every seed
    expected = (set(stages.seeds) if stages is not None else seen) if seen else set()
    notes = []
    if stages is not None and (outside := sorted(seen - expected)):
        notes.append(f"{label + ': ' if label else ''}seed(s) {', '.join(map(str, outside))} "
                     "outside the design, not used")
    sides = [_Side({s: r for s, r in usable.items() if s in expected},
                   sorted(expected - set(usable))) for usable, _ in out]
    return sides[0], sides[1], notes


def _stage(stages: Stages | None, seed: int) -> int:
    return 1 if stages is None else (stages.stage_of(seed) or 1)


def _gain_cell(claim: dict[str, Any], mine: _Side, base: _Side, label: str,
               stages: Stages | None) -> tuple[CellResult, float]:
    """Return the cell of per-seed gains (failed seeds of either side marked) and the
    baseline's mean over the paired seeds."""
    sign = 1.0 if higher_is_better(claim["metric"].split(".")[-1]) else -1.0
    seeds = sorted(set(mine.usable) & set(base.usable))
    gains = [sign * (metric_value(mine.usable[s], claim["metric"])
                     - metric_value(base.usable[s], claim["metric"])) for s in seeds]
    base_mean = float(np.mean([metric_value(base.usable[s], claim["metric"])
                               for s in seeds])) if seeds else math.nan
    return _cell(label, gains, seeds, mine.failed, base.failed, stages), base_mean


def _cell(label: str, values: list[float], seeds: list[int], failed: list[int],
          failed_baseline: list[int], stages: Stages | None) -> CellResult:
    lost = sorted(set(failed) | set(failed_baseline))
    return CellResult(label, list(values), list(seeds), [_stage(stages, s) for s in seeds],
                      failed=list(failed), failed_baseline=list(failed_baseline),
                      failed_stages=[_stage(stages, s) for s in lost],
                      expected=len(seeds) + len(lost))


def _steps_cell(claim: dict[str, Any], mine: _Side, base: _Side, label: str,
                stages: Stages | None, stream: np.random.SeedSequence,
                design: bool) -> CellResult:
    """Steps saved per seed, less the mean saving of baseline-versus-baseline pairs of the
    same stage (the first-crossing bias of a noisy curve), tested as a superiority gain by
    the studentised bootstrap (the saving is discrete and skewed: neither the t test nor a
    sign-flip test holds). A seed whose curve cannot be read is a failed seed."""
    from dpbench.analysis.steps_to_target import saving

    metric = claim["metric"]
    pairs = {s: saving(base.usable[s], mine.usable[s], metric)
             for s in sorted(set(mine.usable) & set(base.usable))}
    unread = sorted(s for s, p in pairs.items() if p is None)
    pairs = {s: p for s, p in pairs.items() if p is not None}
    values, seeds, censored, null_text = [], [], 0, []
    for stage in (1, 2):
        mine_s = [s for s in pairs if _stage(stages, s) == stage]
        base_s = [s for s in base.usable if _stage(stages, s) == stage]
        null = [p[0] for i in base_s for j in base_s if i != j
                if (p := saving(base.usable[i], base.usable[j], metric)) is not None]
        null_mean = float(np.mean(null)) if null else math.nan
        if mine_s:
            null_text.append(f"stage {stage}: null of {len(null)} baseline pairs, mean "
                             f"{null_mean:.3f}" if design else
                             f"null of {len(null)} baseline pairs: mean {null_mean:.3f}")
        for s in mine_s:
            if math.isfinite(null_mean):
                values.append(pairs[s][0] - null_mean)
                seeds.append(s)
                censored += not pairs[s][1]
    cell = _cell(label, values, seeds, sorted(set(mine.failed) | set(unread)), base.failed,
                 stages)
    cell = _difference_cell({**claim, "kind": "superiority"}, cell, math.nan, exact=True,
                            design=design, rng=np.random.default_rng(stream))
    if pairs:
        prefix = f"{label}: " if label else ""
        cell.notes.append(f"{prefix}raw saving {np.mean([p[0] for p in pairs.values()]):.3f}, "
                          f"{censored}/{len(values)} never reached; " + "; ".join(null_text))
    return cell


def _interaction_cell(claim: dict[str, Any], records: list[dict[str, Any]],
                      everything: list[dict[str, Any]], stages: Stages | None
                      ) -> tuple[CellResult, list, list[str], list[dict]]:
    """Return the cell of per-seed differences of the gain at the first contrast value and
    at the second (a seed failed on either counts failed), the two gaps by seed, the notes
    and the records used."""
    contrast = claim["contrast"]
    gaps, notes, used, failed, failed_base = [], [], [], set(), set()
    for value in contrast["values"]:
        cell = {**(claim.get("where") or {}), contrast["key"]: value}
        label = f"{contrast['key'].split('.')[-1]}={value}"
        mine, base, more = _sides(claim, records, everything, cell, label, stages,
                                  claim["metric"])
        gain, _ = _gain_cell(claim, mine, base, label, stages)
        gaps.append(dict(zip(gain.seeds, gain.values)))
        notes += more
        used += list(mine.usable.values()) + list(base.usable.values())
        failed |= set(mine.failed)
        failed_base |= set(base.failed)
    first, second = gaps
    seeds = sorted(set(first) & set(second))
    lost = (set(first) ^ set(second)) - failed - failed_base
    if lost:   # one gap of a seed is missing without a failure on record
        failed |= lost
    return (_cell("difference of gaps", [first[s] - second[s] for s in seeds], seeds,
                  sorted(failed), sorted(failed_base), stages), gaps, notes, used)


def _completed(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("status", "completed") == "completed"]


# --- a claim --------------------------------------------------------------------------------

def evaluate_claim(claim: dict[str, Any], records: list[dict[str, Any]],
                   seed: int = NULL_SEED, stages: Stages | None = None) -> dict[str, Any]:
    """Return the claim with its cells, ``measured`` text, ``verdict`` (alone: a family of
    one; ``adjust`` decides within the paper), the p-values ``p_for`` / ``p_against`` /
    ``p_smaller`` (ALPHA scale), ``p_improvement``, ``seeds_needed``, its failure rate and
    ``notes``. ``stages``: the paper's design (None: one fixed look at the full alpha).

    ``records`` may hold failed runs; a seed without a usable run on a side is a failed seed
    (imputed per test by the least favourable observed gain), and a failure rate shown above
    the claim's ``max_failure_rate`` reads "failed runs".
    """
    validate_claim(claim)
    kind = claim.get("kind", "superiority")
    claim = {**claim, "kind": kind}
    everything, records = list(records), _completed(records)
    design = stages is not None
    where = claim.get("where") or {}
    cells: list[CellResult] = []
    notes: list[str] = []
    used: list[dict[str, Any]] = []
    improvement: list[float] = []
    streams = np.random.SeedSequence(seed).spawn(max(1, len(expand_cells(where))) + 1)
    if kind == "interaction":
        cell, gaps, notes, used = _interaction_cell(claim, records, everything, stages)
        cells.append(_difference_cell(claim, cell, math.nan, design=design))
        improvement = [g for gap in gaps for g in gap.values()]  # A against B in each run
        notes.insert(0, "; ".join(f"gap at {v}: {t_interval(list(g.values())).format(3)}"
                                  for v, g in zip(claim["contrast"]["values"], gaps)))
    for cell_where, stream in zip(expand_cells(where), streams[1:]):
        if kind == "interaction":
            break
        label = cell_label(cell_where, where)
        if kind == "threshold":
            claim_t = {**claim, "baseline": claim.get("method")}
            mine, _, more = _sides(claim_t, records, everything, cell_where, label, stages,
                                   claim["metric"])
            seeds = sorted(mine.usable)
            cell = _cell(label, [metric_value(mine.usable[s], claim["metric"]) for s in seeds],
                         seeds, mine.failed, [], stages)
            cells.append(_threshold_cell(claim, cell, design))
            notes += more
            used += list(mine.usable.values())
            continue
        steps = claim.get("statistic") == "steps_saving"
        mine, base, more = _sides(claim, records, everything, cell_where, label, stages,
                                  "" if steps else claim["metric"])
        notes += more
        used += list(mine.usable.values()) + list(base.usable.values())
        if steps:
            cells.append(_steps_cell(claim, mine, base, label, stages, stream, design))
        else:
            cell, base_mean = _gain_cell(claim, mine, base, label, stages)
            cells.append(_difference_cell(claim, cell, base_mean, design=design))
        improvement += cells[-1].values
        notes += cells[-1].notes
    edge = sorted({f"{r.get('method_name')} {_cell_text(r)}" for r in used
                   if (lookup(r, "tuning.at_grid_edge") is True)})
    if edge:
        notes.append("learning rate at the grid's edge: " + ", ".join(edge))
    if missing_cells := [c.label or "all" for c in cells if not c.values]:
        notes.append(f"no runs yet: {', '.join(missing_cells)}")
    for c in cells:
        prefix = f"{c.label}: " if c.label else ""
        for side, seeds in ((claim.get("method"), c.failed),
                            (claim.get("baseline"), c.failed_baseline)):
            if seeds:
                notes.append(f"{prefix}{side} failed on seed(s) {', '.join(map(str, seeds))} "
                             "(no usable run; each test imputes its least favourable gain)")
        if c.exact and len(c.values) >= 2:
            notes.append(f"{prefix}decided by the studentised bootstrap")
    row = {**claim, "cells": [c.__dict__ for c in cells],
           "measured": _measured(cells, claim.get("digits", 3)) or "no runs",
           "edge": bool(edge), "p_improvement": probability_of_improvement(improvement)
           if improvement else math.nan, "notes": notes, "staged": design,
           "design": _design_text(cells, design),
           **_claim_p(cells), **_failures(claim, cells)}
    notes += _paper_number_note(row, cells)
    return _with_verdict(row)


def _failures(claim: dict[str, Any], cells: Sequence[CellResult]) -> dict[str, Any]:
    """Return the claim's failure counts and rates with their Clopper-Pearson intervals, and
    ``failed`` / ``failed_baseline``: a rate shown above ``max_failure_rate`` (its interval
    wholly above it)."""
    limit = float(claim.get("max_failure_rate", FAILURE_LIMIT))
    n = sum(c.expected for c in cells)
    out: dict[str, Any] = {"failure_limit": limit, "expected_seeds": n}
    for key, count in (("failed", sum(len(c.failed) for c in cells)),
                       ("failed_baseline", sum(len(c.failed_baseline) for c in cells))):
        low, high = failure_interval(count, n) if n else (math.nan, math.nan)
        out[f"{key}_count"], out[f"{key}_interval"] = count, (low, high)
        out[key] = bool(count and low > limit)
    return out


def _paper_number_note(row: dict[str, Any], cells: Sequence[CellResult]) -> list[str]:
    """Note a paper's number that the interval of a cell excludes (a claim can be reproduced
    at its target and still rule out the number the paper printed)."""
    if row.get("paper_effect") is None or row["kind"] not in ("superiority", "interaction"):
        return []
    claimed = float(row["paper_effect"])
    out = []
    for c in cells:
        if math.isfinite(c.high) and c.high < claimed:
            out.append(f"{c.label + ': ' if c.label else ''}the interval excludes the paper's "
                       f"{claimed:g} (the gain is smaller than printed)")
        elif math.isfinite(c.low) and c.low > claimed:
            out.append(f"{c.label + ': ' if c.label else ''}the interval lies above the "
                       f"paper's {claimed:g}")
    return out


def _design_text(cells: Sequence[CellResult], design: bool) -> str:
    """Return the seeds of each stage (cells joined by " / "): "5 + 20" (pilot + follow-up)
    in a design, "n" for one fixed look."""
    if not cells:
        return "—"
    if not design:
        return " / ".join(str(c.expected) for c in cells)
    return " / ".join(f"{c.n_pilot} + {c.n_follow_up}" for c in cells)


def _claim_p(cells: Sequence[CellResult]) -> dict[str, float]:
    """Return the claim's p-values from its cells (``verdicts.cells_p``); NaN unless every
    cell was tested for p_for, over the tested cells against."""
    tested = [c for c in cells if math.isfinite(c.p_for) or math.isfinite(c.p_against)]
    if not tested:
        return {"p_for": math.nan, "p_against": math.nan, "p_smaller": math.nan}
    p_for, p_against, p_smaller = cells_p(*(np.array([getattr(c, k) for c in tested])
                                            for k in ("p_for", "p_against", "p_smaller")))
    return {"p_for": float(p_for) if len(tested) == len(cells) else math.nan,
            "p_against": float(p_against), "p_smaller": float(p_smaller)}


def _with_verdict(row: dict[str, Any], family: int = 1,
                  adjusted: tuple[float, float, float] | None = None) -> dict[str, Any]:
    """Return ``row`` with ``verdict``, ``p`` (the deciding test's), ``p_test``, ``p_holm`` and
    ``seeds_needed`` for a paper family of ``family`` claims; ``adjusted``: the claim's
    adjusted p-values (for, against, claimed effect) within its family (alone: its own)."""
    failed, failed_baseline = row.get("failed", False), row.get("failed_baseline", False)
    p_for, p_against, p_smaller = (row.get(k, math.nan)
                                   for k in ("p_for", "p_against", "p_smaller"))
    holm_for, holm_against, holm_smaller = adjusted or (p_for, p_against, p_smaller)
    if not any(c["values"] for c in row.get("cells", [])):
        verdict = "not run"
    else:
        verdict = decide(holm_for, holm_against, holm_smaller)
        if failed_baseline or (failed and verdict not in AGAINST):
            verdict = "failed runs"
    if verdict == "contradicted":
        test, p, p_holm = "against", p_against, max(holm_against, holm_smaller)
    elif verdict == "smaller than claimed":
        test, p, p_holm = "claimed effect", p_smaller, holm_smaller
    else:
        test, p, p_holm = "for", p_for, holm_for
    hint = seeds_hint(row, family) if verdict == "underpowered" else {}
    return {**row, "verdict": verdict, "p": p, "p_test": test, "p_holm": p_holm,
            "seeds_needed": hint.get("claimed"), "seeds_midway": hint.get("midway"),
            "seeds_follow_up": hint.get("sized", hint.get("claimed")), "hint": hint.get("kind")}


def seeds_hint(row: dict[str, Any], family: int = 1) -> dict[str, Any]:
    """Return the seeds a cell needs to decide the claim with assurance POWER (power
    averaged over each cell's standard deviation as the pilot knows it, ``design``), at the
    claimed effect (twice the target; non-inferiority and equivalence: no difference;
    threshold: its tolerance beyond it) and at the midway effect (half that distance), the
    test for the claim at Holm's first level (alpha / family), every cell jointly (several
    one-sided cells: at the nominal assurance calibrated to deliver POWER,
    ``design.calibrated_assurance``).

    ``kind`` "follow-up" (a design before its follow-up: the follow-up's seeds a cell, each
    cell at its conditional level given the pilot), "fixed" (no design: the seeds of a fresh
    fixed look, never fewer than one more than run), "spent" (the design's two looks are
    done). A count is ">1000" out of reach, "—" when no cell has a spread to go on."""
    cells = row["cells"]
    design = bool(row.get("staged"))
    if design and any(c["n_follow_up"] for c in cells):
        return {"kind": "spent", "claimed": "—", "midway": "—"}
    usable = [c for c in cells if math.isfinite(c["sd"])]
    if len(usable) < len(cells) or not cells:
        return {"kind": "fixed", "claimed": "—", "midway": "—"}
    distance = abs(cells[0]["paper"] - cells[0]["target"]) if row["kind"] != "equivalence" \
        else abs(cells[0]["target"])
    tost = row["kind"] == "equivalence"
    sds = [c["sd"] for c in cells]
    pilot = [max(2, c["n_pilot"] if design else len(c["values"])) for c in cells]
    out: dict[str, Any] = {"kind": "follow-up" if design else "fixed"}
    # the follow-up's size: at the claimed effect, or at the pilot's 97.5 % lower bound where
    # that lies beyond it (any rule on the pilot's data keeps the combination test valid)
    margins = [c.get("pilot_margin", math.nan) for c in cells]
    shown = min(margins) if not tost and all(math.isfinite(m) for m in margins) else -math.inf
    for name, effect in (("claimed", distance), ("midway", distance / 2),
                         ("sized", max(distance, shown))):
        if design:
            q1 = [[c.get("q1_low", math.nan), c.get("q1_high", math.nan)] if tost
                  else c["q1_for"] for c in cells]
            n = follow_up_seeds(effect, sds, pilot, q1, family, tost,
                                margin=distance if tost else None)
            if n is not None and any(c["exact"] for c in cells):
                n = max(n, BOOTSTRAP_MIN_VALUES)
        else:
            least = [len(c["values"]) + 1 for c in cells]
            least += [BOOTSTRAP_MIN_VALUES for c in cells if c["exact"]]
            n = fixed_seeds(effect, sds, pilot, family, tost, min_n=max(least),
                            margin=distance if tost else None)
        out[name] = n if n is not None else ">1000"
    return out


def _cell_text(record: dict[str, Any]) -> str:
    eps = record.get("target_epsilon")
    return f"eps={eps:g}" if isinstance(eps, (int, float)) else "(no target)"


def _measured(cells: Sequence[CellResult], digits: int) -> str:
    parts = []
    for c in cells:
        if not c.values:
            parts.append(f"{c.label}: no pairs".lstrip(": "))
            continue
        if not math.isfinite(c.low):
            text = f"{c.estimate:.{digits}f} (n={len(c.values)})"
        else:
            text = (f"{c.estimate:.{digits}f} [{c.low:.{digits}f}, {c.high:.{digits}f}] "
                    f"(n={len(c.values)})")
        parts.append(f"{c.label}: {text}".lstrip(": "))
    return "; ".join(parts)


def adjust(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return ``rows`` decided within each paper (diagnostics each on their own) by
    ``verdicts.family_p``: Holm over the paper's p_for for "reproduced" (2.5 %), and one
    closed family for "contradicted" and "smaller than claimed" (2.5 %). Adds ``p_holm`` (of
    the deciding test) and ``q_bh`` (Benjamini-Hochberg of p_for over the table, diagnostics
    excluded); a verdict lost to the adjustment is noted."""
    def family_of(r: dict[str, Any]) -> bool:
        return not r.get("diagnostic")

    def p_for(r: dict[str, Any]) -> float:
        return 1.0 if r.get("failed") or r.get("failed_baseline") else r.get("p_for", math.nan)

    tested = [i for i, r in enumerate(rows) if family_of(r) and math.isfinite(p_for(r))]
    out = [dict(r) for r in rows]
    for i, value in zip(tested, benjamini_hochberg([p_for(rows[i]) for i in tested])):
        out[i]["q_bh"] = value
    for r in out:
        r.setdefault("q_bh", math.nan)
    for paper in dict.fromkeys(r.get("paper") for r in rows):
        family = [i for i, r in enumerate(rows) if r.get("paper") == paper and family_of(r)]
        if not family:
            continue
        adjusted = family_p(*(np.array([f(rows[i]) for i in family]) for f in (
            p_for, lambda r: r.get("p_against", math.nan),
            lambda r: r.get("p_smaller", math.nan))))
        for j, i in enumerate(family):
            before = rows[i].get("verdict")
            out[i] = _with_verdict(out[i], len(family),
                                   tuple(float(a[0, j]) for a in adjusted))
            if before != out[i]["verdict"] and before not in ("not run", "failed runs"):
                out[i]["notes"] = [*out[i]["notes"], f"{before} before the adjustment over "
                                   f"the paper's {len(family)} claims (adjusted p "
                                   f"{format_p(out[i]['p_holm'])})"]
    for i, r in enumerate(out):   # diagnostics: each its own family of one
        if not family_of(r):
            out[i] = _with_verdict(r)
    return out
