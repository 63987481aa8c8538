"""The claims table: each paper claim as a declared test, its measurement and a verdict
(docs/tuning-and-claims.md, "The claims table" and "Verdict rules").

A claim is declared in ``conf/reproduce/<paper>.yaml`` and evaluated on the runs its
reproduction wrote. Every comparison is a *gain*: method minus baseline, paired by seed,
signed so that a positive gain is in the claim's favour (baseline minus method for metrics
where lower is better). Kinds:

- ``superiority``: the gain exceeds ``fraction`` (default one half) of the claimed effect:
  ``paper_effect`` (the paper's number, in the metric's units) or, when the paper gives no
  number, the declared smallest effect of interest ``effect`` (defaults by metric,
  ``METRIC_DEFAULTS``); the region between that target and the claimed effect is where
  "reproduced" and "smaller than claimed" may both be shown. ``statistic: steps_saving``
  tests the share of steps saved to the baseline's final ``metric`` instead (exact
  sign-flip test; ``paper_effect`` or ``effect`` required).
- ``non_inferiority``: the gain is above ``-margin``.
- ``equivalence``: the gain is within ``+-margin`` (TOST).
- ``threshold``: the mean of ``metric`` over the method's runs is ``above`` / ``below``
  ``threshold`` (``tolerance``: the band on the claimed side read as "smaller than claimed").
- ``interaction``: the gain at ``contrast.values[0]`` minus the gain at ``contrast.values[1]``
  of the key ``contrast.key``, paired by seed, exceeds ``fraction`` of ``effect`` (absolute).

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
    exact_min_n,
    higher_is_better,
    holm,
    no_spread,
    one_sided_p,
    probability_of_improvement,
    sd_upper_bound,
    seeds_for_power,
    sign_flip_interval,
    t_interval,
    tost,
)

KINDS = ("superiority", "non_inferiority", "equivalence", "threshold", "interaction")
VERDICTS = ("reproduced", "smaller than claimed", "contradicted", "underpowered", "failed runs",
            "not run")
#: the verdicts against a claim (decided by the tests of the claimed effect and the target)
AGAINST = ("smaller than claimed", "contradicted")
#: the share of the claimed effect (the paper's, or the declared smallest effect of interest)
#: that a superiority claim must be shown to exceed to be reproduced
FRACTION = 0.5
#: a threshold claim's default tolerance, as a share of the threshold: the mean shown within
#: it on the claimed side reads "smaller than claimed" (so that a mean at the threshold is
#: decided too)
THRESHOLD_TOLERANCE = 0.1
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
    "mia_tpr_at_1pct_fpr": {"effect": 0.01, "margin": 0.01},
    "mia_auc": {"effect": 0.02, "margin": 0.02},
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


# --- spec validation ----------------------------------------------------------------------

class ClaimSpecError(ValueError):
    """A claim declared in a spec that cannot be tested as written; the message is one line
    naming the claim and the key."""


_POSITIVE = ("paper_effect", "effect", "effect_relative", "margin", "margin_relative",
             "tolerance")


def validate_claim(claim: dict[str, Any]) -> None:
    """Raise ClaimSpecError (one line: the claim and the key) for a claim whose test would be
    meaningless: an unknown kind; a size that is not a positive number; a relative effect
    on an interaction or a steps saving (it would be a share of the baseline's mean of a
    difference, or of a share of steps); a steps saving or an interaction without an
    absolute effect (a metric's default is in the metric's units, not in steps);
    ``fraction`` outside (0, 1); a threshold without ``threshold``."""
    name = claim.get("id", claim.get("claim", "?"))
    kind = claim.get("kind", "superiority")

    def fail(key: str, why: str) -> None:
        raise ClaimSpecError(f"claim {name!r}: key {key!r}: {why}")

    if kind not in KINDS:
        fail("kind", f"unknown kind {kind!r} (known: {', '.join(KINDS)})")
    for key in _POSITIVE:
        value = claim.get(key)
        if key in claim and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                 and math.isfinite(value) and value > 0):
            fail(key, f"must be a positive number (got {value!r})")
    fraction = claim.get("fraction", FRACTION)
    if not (isinstance(fraction, (int, float)) and 0 < fraction < 1):
        fail("fraction", f"must lie strictly between 0 and 1 (got {fraction!r})")
    steps = claim.get("statistic") == "steps_saving"
    if steps or kind == "interaction":
        what = "a steps saving" if steps else "an interaction"
        for key in ("effect_relative", "margin_relative"):
            if key in claim:
                fail(key, f"a relative size is undefined for {what} (declare 'effect')")
        if "paper_effect" not in claim and "effect" not in claim:
            fail("paper_effect" if steps else "effect",
                 f"{what} needs an absolute size (the metric's default is in its own units)")
    if kind == "threshold" and not isinstance(claim.get("threshold"), (int, float)):
        fail("threshold", "a threshold claim needs a number")
    if kind == "threshold" and claim.get("threshold") == 0 and "tolerance" not in claim:
        fail("tolerance", "a threshold of 0 needs a declared tolerance")
    if kind == "interaction":
        contrast = claim.get("contrast") or {}
        if "key" not in contrast or len(contrast.get("values") or []) != 2:
            fail("contrast", "an interaction needs contrast.key and two contrast.values")


# --- verdict rules on intervals (each tested on fixed numbers) ----------------------------

def superiority_verdict(low: float, high: float, target: float, claimed: float) -> str:
    """Return the verdict of a gain with 95 % interval [low, high] (docs "Verdict rules").

    reproduced: the interval excludes every gain up to ``target`` (the share of the paper's
    effect, or of the smallest effect of interest, that counts); contradicted: it excludes
    every gain from the target up; smaller than claimed: it excludes ``claimed`` (the paper's
    effect) but not the target; underpowered: it holds both. Every true gain is decided with
    enough seeds: above the target by the first rule, below ``claimed`` by the others.
    """
    if low > target:
        return "reproduced"
    if high < target:
        return "contradicted"
    if high < claimed:
        return "smaller than claimed"
    return "underpowered"


def non_inferiority_verdict(low: float, high: float, margin: float) -> str:
    """reproduced when the 95 % interval of the gain is above ``-margin``, contradicted when
    wholly below it, smaller than claimed when below 0 (worse than the baseline, within
    or at the margin), underpowered otherwise."""
    return superiority_verdict(low, high, -margin, 0.0)


def equivalence_verdict(low: float, high: float, margin: float) -> str:
    """reproduced when the 95 % interval lies inside (-margin, margin) (TOST, 2.5 % a side),
    contradicted when it lies wholly outside, smaller than claimed when it excludes 0 (a
    difference is shown, not one beyond the margin; the claims table reads this from the
    97.5 % interval, both directions within the 2.5 % budget), underpowered otherwise."""
    if -margin < low and high < margin:
        return "reproduced"
    if low > margin or high < -margin:
        return "contradicted"
    if low > 0 or high < 0:
        return "smaller than claimed"
    return "underpowered"


def threshold_verdict(low: float, high: float, threshold: float, expect: str,
                      tolerance: float) -> str:
    """reproduced when the 95 % interval of the mean is wholly on the claimed side of
    ``threshold``, contradicted when wholly on the other, smaller than claimed when it
    excludes the threshold moved ``tolerance`` to the claimed side (at most marginally on
    it), underpowered otherwise."""
    if expect == "below":
        low, high, threshold = -high, -low, -threshold
    return superiority_verdict(low, high, threshold, threshold + tolerance)


def decide(p_for: float, p_against: float, p_smaller: float, level: float = ALPHA) -> str:
    """Return the verdict from the claim's three p-values (ALPHA scale, Holm-adjusted within
    a paper): reproduced when the test for the claim rejects at ``level``; otherwise
    contradicted when the tests of the claimed effect and of the target both reject, smaller
    than claimed when only the first does; underpowered otherwise."""
    if p_for <= level:
        return "reproduced"
    if p_smaller <= level:
        return "contradicted" if p_against <= level else "smaller than claimed"
    return "underpowered"


# --- evaluation ---------------------------------------------------------------------------

@dataclass
class CellResult:
    """One cell of a claim: the per-seed values the test uses and its outcome."""

    label: str
    values: list[float]           # per-seed gains (or metric values, threshold claims)
    low: float = math.nan         # the 95 % interval the verdict reads
    high: float = math.nan
    estimate: float = math.nan
    verdict: str = "not run"
    p_for: float = math.nan       # H0: the gain is at most the target (ALPHA scale)
    p_against: float = math.nan   # H0: the gain is at least the target
    p_smaller: float = math.nan   # H0: the gain is at least the claimed effect
    target: float = math.nan      # the effect, margin or threshold the verdict compares with
    paper: float = math.nan       # the claimed effect (the paper's, or the declared one)
    sd: float = math.nan          # the spread of the values (for the seeds hint)
    exact: bool = False           # decided by the exact sign-flip test
    failed: list[int] = field(default_factory=list)   # seeds whose method run failed
    failed_baseline: list[int] = field(default_factory=list)
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


def _failed(claim: dict[str, Any], records: list[dict[str, Any]], method: str | None,
            where: dict[str, Any], usable: Iterable[int]) -> list[int]:
    """Return the seeds of ``method`` in the cell whose run failed (status ``failed``, or
    completed without a finite ``metric``) and that have no usable run."""
    metric = claim["metric"] if claim.get("statistic") != "steps_saving" else ""
    bad = {int(r["seed"]) for r in select(records, method, where, _sweeps(claim))
           if "seed" in r and (r.get("status") == "failed"
                               or (metric and _metric(r, metric) is None))}
    return sorted(bad - set(usable))


def _edges(claim: dict[str, Any], baseline_mean: float) -> tuple[float, float]:
    """Return (target, claimed) of a difference claim in gain units: the gain the claim must
    be shown to exceed, and the effect the paper (or the declared smallest effect of
    interest) states; for equivalence (margin, 0)."""
    kind = claim["kind"]
    if kind in ("non_inferiority", "equivalence"):
        margin = _scaled(claim, "margin", baseline_mean)
        return (-margin, 0.0) if kind == "non_inferiority" else (margin, 0.0)
    paper = claim.get("paper_effect")
    claimed = float(paper) if paper is not None else _scaled(claim, "effect", baseline_mean)
    return float(claim.get("fraction", FRACTION)) * claimed, claimed


def _test(cell: CellResult, target: float, claimed: float, *, equivalence: bool = False,
          exact: bool = False, sign: float = 1.0,
          rng: np.random.Generator | None = None) -> CellResult:
    """Fill ``cell``'s interval, p-values and verdict from its values (``sign`` -1 tests the
    negated values: a threshold expected below). A t test, or the exact sign-flip test when
    ``exact`` or when the values have no spread (docs "Verdict rules")."""
    x = sign * np.asarray(cell.values, dtype=float)
    cell.target, cell.paper = sign * target, sign * claimed
    if len(x) < 2:
        cell.estimate = float(np.mean(cell.values)) if len(x) else math.nan
        cell.verdict = "underpowered" if len(x) else "not run"
        return cell
    cell.sd = float(np.std(x, ddof=1))
    cell.exact = bool(exact or no_spread(x))

    def p(null: float, alternative: str) -> float:
        return one_sided_p(x, null, alternative, exact=cell.exact, rng=rng)

    if equivalence:
        margin = target
        tost_p = (max(p(-margin, "greater"), p(margin, "less")) if cell.exact
                  else tost(x, -margin, margin))
        cell.p_for = min(1.0, 2 * tost_p)
        cell.p_against = min(1.0, 2 * min(p(margin, "greater"), p(-margin, "less")))
        # a difference in either direction: two one-sided tests, Bonferroni (2.5 % in all)
        cell.p_smaller = min(1.0, 4 * min(p(0.0, "greater"), p(0.0, "less")))
    else:
        cell.p_for = min(1.0, 2 * p(target, "greater"))
        cell.p_against = min(1.0, 2 * p(target, "less"))
        cell.p_smaller = min(1.0, 2 * p(claimed, "less"))
    if cell.exact:
        low, high = sign_flip_interval(x, 1 - ALPHA)
    else:
        interval = t_interval(x, 1 - ALPHA)
        low, high = interval.low, interval.high
    cell.estimate = sign * float(x.mean())
    cell.low, cell.high = (low, high) if sign > 0 else (-high, -low)
    cell.verdict = decide(cell.p_for, cell.p_against, cell.p_smaller)
    return cell


def _difference_cell(claim: dict[str, Any], gains: Sequence[float], baseline_mean: float,
                     label: str, *, exact: bool = False,
                     rng: np.random.Generator | None = None) -> CellResult:
    """Test one cell's gains by the claim's kind (superiority, non-inferiority, equivalence,
    interaction)."""
    cell = CellResult(label, list(gains))
    if not cell.values:
        return cell
    target, claimed = _edges(claim, baseline_mean)
    return _test(cell, target, claimed, equivalence=claim["kind"] == "equivalence",
                 exact=exact, rng=rng)


def _threshold_cell(claim: dict[str, Any], values: Sequence[float], label: str) -> CellResult:
    threshold = float(claim["threshold"])
    tolerance = float(claim.get("tolerance", THRESHOLD_TOLERANCE * abs(threshold)))
    sign = 1.0 if claim.get("expect", "above") == "above" else -1.0
    cell = _test(CellResult(label, list(values)), sign * threshold, sign * threshold + tolerance,
                 sign=sign)
    cell.paper = threshold + sign * tolerance
    return cell


def _steps_cell(claim: dict[str, Any], mine: dict[int, dict], base: dict[int, dict],
                label: str, stream: np.random.SeedSequence) -> CellResult:
    """Steps saved per seed, less the mean saving of baseline-versus-baseline pairs (the
    first-crossing bias of a noisy curve), tested as a superiority gain by the exact
    sign-flip test (the saving is discrete and skewed: a t test does not hold)."""
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
    test_stream, null_stream = stream.spawn(2)
    cell = _difference_cell({**claim, "kind": "superiority"},
                            [v - null_mean for v in observed], math.nan, label, exact=True,
                            rng=np.random.default_rng(test_stream))
    prefix = f"{label}: " if label else ""
    if not observed:
        return cell
    cell.notes.append(
        f"{prefix}raw saving {np.mean(observed):.3f}, "
        f"{censored}/{len(observed)} never reached; null of {len(null)} baseline pairs "
        f"({null_censored} never reached): mean {null_mean:.3f}, P(null mean of "
        f"{len(observed)} >= {cell.paper:.3f}) = "
        f"{null_exceeds(null, len(observed), cell.paper, null_stream):.2f}")
    return cell


def null_exceeds(null: Sequence[float], n: int, value: float,
                 stream: np.random.SeedSequence, draws: int = NULL_DRAWS) -> float:
    """Return P(mean of ``n`` draws from ``null`` >= ``value``) by resampling (its own stream)."""
    if not null or n < 1 or not math.isfinite(value):
        return math.nan
    rng = np.random.default_rng(stream)
    means = rng.choice(np.asarray(null, dtype=float), size=(draws, n)).mean(axis=1)
    return float(np.mean(means >= value - 1e-12))


def _interaction_gains(claim: dict[str, Any], records: list[dict[str, Any]],
                       everything: list[dict[str, Any]]) -> tuple:
    """Return per seed the gain at the first contrast value minus the gain at the second,
    the two gaps by seed, the notes, the records used and the failed seeds of each side."""
    contrast = claim["contrast"]
    gaps, notes, used, failed, failed_base = [], [], [], [], []
    for value in contrast["values"]:
        cell = {**(claim.get("where") or {}), contrast["key"]: value}
        label = f"{contrast['key'].split('.')[-1]}={value}"
        mine, base, missing = _pairs(claim, records, cell, label)
        gaps.append(_gains(claim, mine, base))
        notes += missing
        used += list(mine.values()) + list(base.values())
        failed += _failed(claim, everything, claim["method"],
                          {**cell, **claim.get("method_where", {})}, mine)
        failed_base += _failed(claim, everything, claim["baseline"],
                               {**cell, **claim.get("baseline_where", {})}, base)
    first, second = gaps
    seeds = sorted(set(first) & set(second))
    if dropped := sorted(set(first) ^ set(second)):
        notes.append(f"seed(s) {', '.join(map(str, dropped))} lack one of the two gaps")
    return ([first[s] - second[s] for s in seeds], gaps, notes, used,
            sorted(set(failed)), sorted(set(failed_base)))


def _completed(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("status", "completed") == "completed"]


def evaluate_claim(claim: dict[str, Any], records: list[dict[str, Any]],
                   seed: int = NULL_SEED) -> dict[str, Any]:
    """Return the claim with its cells, ``measured`` text, ``verdict`` (alone: a family of
    one; ``adjust`` decides within the paper), the p-values ``p_for`` / ``p_against`` /
    ``p_smaller`` (ALPHA scale), ``p_improvement``, ``seeds_needed`` and ``notes``.

    ``records`` may hold failed runs: a seed whose method run failed counts as the worst
    outcome (the claim cannot be reproduced; a verdict against it on the other seeds
    stands), one whose baseline run failed leaves the claim "failed runs".
    """
    validate_claim(claim)
    kind = claim.get("kind", "superiority")
    claim = {**claim, "kind": kind}
    everything, records = list(records), _completed(records)
    where = claim.get("where") or {}
    cells: list[CellResult] = []
    notes: list[str] = []
    used: list[dict[str, Any]] = []
    improvement: list[float] = []
    streams = np.random.SeedSequence(seed).spawn(max(1, len(_cells(where))) + 1)
    if kind == "interaction":
        diffs, gaps, notes, used, failed, failed_base = _interaction_gains(
            claim, records, everything)
        cell = _difference_cell(claim, diffs, math.nan, "difference of gaps")
        cell.failed, cell.failed_baseline = failed, failed_base
        cells.append(cell)
        improvement = [g for gap in gaps for g in gap.values()]  # A against B in each run
        gap_text = "; ".join(f"gap at {v}: {t_interval(list(g.values())).format(3)}"
                             for v, g in zip(claim["contrast"]["values"], gaps))
        notes.insert(0, gap_text)
    for cell_where, stream in zip(_cells(where), streams[1:]):
        if kind == "interaction":
            break
        label = _cell_label(cell_where, where)
        if kind == "threshold":
            runs = select(records, claim.get("method"), cell_where, _sweeps(claim))
            values = {int(r["seed"]): v for r in runs
                      if (v := _metric(r, claim["metric"])) is not None}
            cells.append(_threshold_cell(claim, list(values.values()), label))
            cells[-1].failed = _failed(claim, everything, claim.get("method"), cell_where,
                                       values)
            used += runs
            continue
        mine, base, missing = _pairs(claim, records, cell_where, label)
        notes += missing
        used += list(mine.values()) + list(base.values())
        if claim.get("statistic") == "steps_saving":
            cells.append(_steps_cell(claim, mine, base, label, stream))
            improvement += cells[-1].values
        else:
            gains = _gains(claim, mine, base)
            base_mean = float(np.mean([_metric(base[s], claim["metric"]) for s in gains])) \
                if gains else math.nan
            cells.append(_difference_cell(claim, list(gains.values()), base_mean, label))
            improvement += list(gains.values())
        cells[-1].failed = _failed(claim, everything, claim["method"],
                                   {**cell_where, **claim.get("method_where", {})}, mine)
        cells[-1].failed_baseline = _failed(
            claim, everything, claim["baseline"],
            {**cell_where, **claim.get("baseline_where", {})}, base)
        notes += cells[-1].notes
    edge = sorted({f"{r.get('method_name')} {_cell_text(r)}" for r in used
                   if (lookup(r, "tuning.at_grid_edge") is True)})
    if edge:
        notes.append("learning rate at the grid's edge: " + ", ".join(edge))
    if missing_cells := [c.label or "all" for c in cells if not c.values]:
        notes.append(f"no runs yet: {', '.join(missing_cells)}")
    for c in cells:
        prefix = f"{c.label}: " if c.label else ""
        if c.failed:
            notes.append(f"{prefix}{claim.get('method')} failed on seed(s) "
                         f"{', '.join(map(str, c.failed))} (the worst outcome: the claim "
                         f"cannot be reproduced)")
        if c.failed_baseline:
            notes.append(f"{prefix}{claim.get('baseline')} failed on seed(s) "
                         f"{', '.join(map(str, c.failed_baseline))}")
        if c.exact and len(c.values) >= 2:
            notes.append(f"{prefix}decided by the exact sign-flip test"
                         + (" (no spread)" if no_spread(c.values) else ""))
    row = {**claim, "cells": [c.__dict__ for c in cells],
           "measured": _measured(cells, claim.get("digits", 3)) or "no runs",
           "edge": bool(edge), "p_improvement": probability_of_improvement(improvement)
           if improvement else math.nan, "notes": notes, **_claim_p(cells)}
    row["failed"] = any(c.failed for c in cells)
    row["failed_baseline"] = any(c.failed_baseline for c in cells)
    return _with_verdict(row)


def _claim_p(cells: Sequence[CellResult]) -> dict[str, float]:
    """Return the claim's p-values from its cells: the claim holds only if every cell does
    (intersection-union: its p is the largest cell's), and fails if any cell does (a union:
    the smallest cell p times the cells tested, Bonferroni)."""
    tested = [c for c in cells if len(c.values) >= 2]
    if not tested:
        return {"p_for": math.nan, "p_against": math.nan, "p_smaller": math.nan}
    k = len(tested)
    return {"p_for": max(c.p_for for c in tested) if len(tested) == len(cells) else math.nan,
            "p_against": min(1.0, k * min(c.p_against for c in tested)),
            "p_smaller": min(1.0, k * min(c.p_smaller for c in tested))}


def _with_verdict(row: dict[str, Any], family: int = 1,
                  adjusted: tuple[float, float, float] | None = None) -> dict[str, Any]:
    """Return ``row`` with ``verdict``, ``p`` (the deciding test's), ``p_test``, ``p_holm`` and
    ``seeds_needed`` for a paper family of ``family`` claims; ``adjusted``: the claim's Holm
    p-values (for, against, claimed effect) within its family (alone: its own p-values)."""
    failed, failed_baseline = row.get("failed", False), row.get("failed_baseline", False)
    p_for = 1.0 if failed or failed_baseline else row.get("p_for", math.nan)
    p_against, p_smaller = row.get("p_against", math.nan), row.get("p_smaller", math.nan)
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
        test, p, p_holm = "for", row.get("p_for", math.nan), holm_for
    undecided = verdict == "underpowered"   # more seeds do not mend a failed run
    return {**row, "verdict": verdict, "p": p, "p_test": test, "p_holm": p_holm,
            "seeds_needed": seeds_hint(row, family) if undecided else None}


def seeds_hint(row: dict[str, Any], family: int = 1) -> int | str:
    """Return the seeds at which the rule as implemented decides the claim with probability
    POWER when the true effect is the claimed one (twice the target; for non-inferiority and
    equivalence no difference; for a threshold the threshold plus its tolerance): the joint
    noncentral-t power of every cell at the Holm level of a family of ``family`` claims
    (alpha / family, its first step), each cell's standard deviation taken at its
    SD_CONFIDENCE upper bound; never fewer than one more than already run. ">1000" when out
    of reach, "—" when no cell has two values."""
    cells = [c for c in row["cells"] if len(c["values"]) >= 2]
    if len(cells) < len(row["cells"]) or not cells:
        return "—"
    alpha = ALPHA / 2 / max(1, family)
    effect = abs(cells[0]["paper"] - cells[0]["target"]) if row["kind"] != "equivalence" \
        else abs(cells[0]["target"])
    sds = [sd_upper_bound(c["sd"], len(c["values"])) for c in cells]
    min_n = max(len(c["values"]) for c in cells) + 1
    if any(c["exact"] for c in cells):
        min_n = max(min_n, exact_min_n(alpha))
    n = seeds_for_power(sds, effect, alpha, tost=row["kind"] == "equivalence", min_n=min_n)
    return n if n is not None else ">1000"


def _sweeps(claim: dict[str, Any]) -> list[str] | None:
    sweeps = claim.get("sweep")
    return [sweeps] if isinstance(sweeps, str) else sweeps


def _cell_text(record: dict[str, Any]) -> str:
    eps = record.get("target_epsilon")
    return f"eps={eps:g}" if isinstance(eps, (int, float)) else "(no target)"


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
    """Return ``rows`` decided within each paper (diagnostics each on their own), Holm on
    each side: reproduced when Holm over the paper's p_for rejects; smaller than claimed when
    Holm over the paper's p_smaller rejects; contradicted when Holm over the paper's
    p_against rejects too. Adds ``p_holm`` (of the deciding test) and ``q_bh``
    (Benjamini-Hochberg of p_for over the table, diagnostics excluded); a verdict lost to
    Holm is noted."""
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
        adjusted = list(zip(*(holm([f(rows[i]) for i in family]) for f in (
            p_for, lambda r: r.get("p_against", math.nan),
            lambda r: r.get("p_smaller", math.nan)))))
        for i, holm_p in zip(family, adjusted):
            before = rows[i].get("verdict")
            out[i] = _with_verdict(out[i], len(family), tuple(_finite_or(p) for p in holm_p))
            if before != out[i]["verdict"] and before not in ("not run", "failed runs"):
                out[i]["notes"] = [*out[i]["notes"], f"{before} before Holm over the "
                                   f"paper's {len(family)} claims (Holm p "
                                   f"{_p(out[i]['p_holm'])})"]
    return out


def _finite_or(value: float, default: float = math.nan) -> float:
    return value if math.isfinite(value) else default


def _number(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, str):
        return value
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _p(value: Any) -> str:
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


def claims_markdown(rows: list[dict[str, Any]], figures: Sequence[str] = ()) -> str:
    """Return the claims table (one claim a row) with its legend, counts and figure links."""
    from dpbench.analysis.tables import markdown_text

    head = ("| paper | claim | kind | paper's number | target | dpbench gain [95 % CI] (n) "
            "| P(A>B) | p (test) | Holm p | BH q | verdict | seeds needed | notes | command |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for row in rows:
        verdict = row["verdict"] + (" †" if row.get("edge") else "")
        p_text = _p(row.get("p")) + (f" ({row['p_test']})" if row.get("p_test")
                                     and math.isfinite(row.get("p", math.nan)) else "")
        cells = [row.get("paper", ""), row.get("claim", ""), row.get("kind", ""),
                 row.get("paper_value", ""), target_text(row), row.get("measured", ""),
                 _number(row.get("p_improvement"), 2), p_text,
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
Verdicts (each paper's claims are one family: a false "reproduced" and a false
"contradicted" each at most 2.5 %, Holm within the paper; the forest plots use the same
colours):
- **reproduced**: the 95 % interval excludes every gain up to the target (for equivalence: it
  lies inside the margin; non-inferiority: above minus the margin; threshold: on the claimed
  side).
- **smaller than claimed**: the interval excludes the paper's effect (or the declared smallest
  effect of interest) but not the target; for non-inferiority: worse than the baseline, not
  beyond the margin; equivalence: a difference is shown, not one beyond the margin;
  threshold: at most marginally on the claimed side.
- **contradicted**: the interval excludes the target and everything beyond it (equivalence:
  it lies wholly outside the margin).
- **underpowered**: the interval holds both the target and the claimed effect; more seeds
  decide it (the seeds needed).
- **failed runs**: a run of the claim failed; failures count as the worst outcome, so the
  claim cannot be reproduced (a verdict against it on the other seeds stands).
- **not run**: no runs yet.

Gain: method minus baseline paired by seed, signed so that positive is in the claim's favour
(baseline minus method for RMSE and ECE). Target: the share of the paper's effect (or of the
declared effect) a superiority claim must exceed, with the claimed effect in brackets; the
margin of an equivalence or non-inferiority claim; a threshold's value. P(A>B): the share of
runs (seed and cell) on which the method wins. p (test): the p-value of the test that
decided (for: the claim; claimed effect: H0 the gain reaches the claimed effect; against: H0
the gain reaches the target), one-sided doubled (TOST for equivalence; an "at every" claim
takes its largest cell p for, its smallest cell p against times the cells). Holm p: that
test adjusted within the paper; BH q: Benjamini-Hochberg of the claims' p over the table
(diagnostics excluded). Seeds needed: the seeds at which the rule decides the claim with
80 % probability when the effect is the claimed one, every cell jointly, at the Holm level,
from an 80 % upper bound on the spread. An exact sign-flip test replaces the t test for
steps savings and samples without spread. † a learning rate was chosen at the edge of its
grid in one of the claim's cells: the verdict is provisional. Rules: docs/tuning-and-claims.md,
"Verdict rules".
"""
