"""Operating characteristics of the claims' design, by Monte Carlo with known truth
(docs/tuning-and-claims.md, "Operating characteristics").

The whole procedure as ``dpbench-reproduce --until-decided`` runs it, vectorised over draws:
a pilot of ``pilot`` seeds a cell; every cell's one-sided tests on it (``stats.one_sided_q``:
t tests, the studentised bootstrap for steps savings), a failed seed imputed as
``claims._stage_q`` does; the pilot's look (``design.design_p``) decided within the paper
(``verdicts.cells_p``, ``verdicts.family_p``); each undecided claim's follow-up sized by
``design.follow_up_seeds`` (the tool's hint), stopped for futility beyond ``budget`` seeds a
cell; the follow-up's new seeds tested alone and combined with the pilot's; the combined look
decided within the paper; a failure rate shown above ``FAILURE_LIMIT`` reads "failed runs".
Gains have standard deviation 1 (the target at 0.5 and the claimed effect at 1; a margin of
0.5), drawn ``normal``, ``right`` / ``left``-skewed (a standardised gamma of shape 2,
skewness 1.41) or ``heavy``-tailed (Student t, 3 degrees of freedom), each seed failing with
probability ``failure``. ``tests/analysis/test_claims_operating.py`` checks that these
verdicts equal ``evaluate_claim`` + ``adjust`` on the same draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from dpbench.analysis.claim_spec import FAILURE_LIMIT
from dpbench.analysis.design import (
    STAGE_SKEW_FLOOR,
    design_p,
    fixed_seeds_many,
    follow_up_seeds_many,
    pilot_seeds,
)
from dpbench.analysis.stats import ALPHA, BOOTSTRAP_DRAWS, SKEW_SHIFT_MIN_N, one_sided_q
from dpbench.analysis.verdicts import MIN_VALUES, cells_p, family_p

CODES = ("reproduced", "smaller than claimed", "contradicted", "underpowered", "failed runs")
#: the fewest values of a bootstrapped cell (``claims.BOOTSTRAP_MIN_VALUES``)
BOOTSTRAP_MIN = 6


@dataclass(frozen=True)
class Claim:
    """A claim of the simulation: its kind, cells, and its target and claimed effect in
    units of the cells' standard deviation (equivalence: target = the margin); ``sds`` the
    cells' own standard deviations where they differ."""

    kind: str = "superiority"   # superiority (also interaction, threshold), non_inferiority,
    cells: int = 1              # equivalence
    target: float = 0.5
    claimed: float = 1.0
    exact: bool = False         # the studentised bootstrap (steps savings)
    sds: tuple[float, ...] | None = None   # each cell's standard deviation (None: all 1)


def noise(dist: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Return mean-0, SD-1 draws: ``normal``, ``right`` / ``left`` (a standardised gamma of
    shape 2, and its mirror), ``heavy`` (Student t with 3 degrees of freedom / sqrt(3))."""
    if dist == "normal":
        return rng.standard_normal(shape)
    if dist in ("right", "left"):
        g = (rng.gamma(2.0, 1.0, shape) - 2.0) / math.sqrt(2.0)
        return g if dist == "right" else -g
    if dist == "heavy":
        return rng.standard_t(3, shape) / math.sqrt(3.0)
    raise ValueError(f"unknown distribution {dist!r}")


def _impute(x: np.ndarray, failed: np.ndarray, alternative: str) -> np.ndarray:
    """Each failed value replaced by its row's least favourable observed one (smallest for
    ``greater``, largest for ``less``); a row with no observed value stays NaN."""
    kept = np.where(failed, np.nan, x)
    with np.errstate(all="ignore"):
        fill = np.nanmin(kept, -1) if alternative == "greater" else np.nanmax(kept, -1)
    return np.where(failed, fill[..., None], x)


def _q(x: np.ndarray, failed: np.ndarray, null: float, alternative: str, exact: bool,
       rng: np.random.Generator, floor: float = STAGE_SKEW_FLOOR) -> np.ndarray:
    """One stage's one-sided p-values over rows (``claims._stage_q`` vectorised)."""
    if x.shape[-1] < (BOOTSTRAP_MIN if exact else MIN_VALUES):
        return np.full(x.shape[:-1], np.nan)
    filled = _impute(x, failed, alternative)
    out = np.full(x.shape[:-1], np.nan)
    ok = ~np.isnan(filled).any(-1)
    if ok.any():
        out[ok] = one_sided_q(filled[ok], null, alternative, bootstrap=exact, rng=rng,
                              draws=BOOTSTRAP_DRAWS, floor=floor)
    return out


def _tests(claim: Claim) -> list[tuple[float, str]]:
    """The elementary one-sided tests of a claim's cell (null, alternative)."""
    if claim.kind == "equivalence":
        m = claim.target
        return [(-m, "greater"), (m, "less"), (m, "greater"), (-m, "less"), (0.0, "greater"),
                (0.0, "less")]
    return [(claim.target, "greater"), (claim.target, "less"), (claim.claimed, "less")]


def _sides(claim: Claim, q: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """A cell's (p_for, p_against, p_smaller) on the ALPHA scale (``claims._test``)."""
    if claim.kind == "equivalence":
        p_for = np.minimum(1, 2 * np.maximum(q[0], q[1]))
        p_against = np.minimum(1, 2 * np.minimum(q[2], q[3]))
        p_smaller = np.minimum(1, 4 * np.minimum(q[4], q[5]))
    else:
        p_for, p_against, p_smaller = (np.minimum(1, 2 * v) for v in q)
    return p_for, p_against, np.fmin(p_smaller, p_against)


@dataclass
class Outcome:
    """The simulated verdict codes (draws x claims) at the pilot's look and at the end, the
    seeds a cell each claim used (failed ones included), and its follow-up's hint (0: none
    sized, -1: out of reach)."""

    pilot_codes: np.ndarray
    codes: np.ndarray
    seeds: np.ndarray
    hints: np.ndarray


def default_pilot(family: list[Claim]) -> int:
    """The design's pilot for a paper of these claims (``design.pilot_seeds``: more seeds
    with a one-sided claim of several cells), as ``dpbench-reproduce --until-decided`` picks
    it from the spec."""
    return pilot_seeds(any(c.cells > 1 and c.kind != "equivalence" for c in family))


def _stage(claim: Claim, effect: float, rows: int, n: int, dist: str, failure: float,
           rng: np.random.Generator, floor: float = STAGE_SKEW_FLOOR
           ) -> tuple[list[list[np.ndarray]], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Draw one stage of a claim: per cell the elementary tests' q (rows), and per row the
    failures, the cells' spreads of observed values and the cells' q of the test for the
    claim (equivalence: rows x cells x 2, the sides against the lower and upper margin)."""
    qs, failed, sds, q_for = [], np.zeros(rows), np.zeros((rows, claim.cells)), []
    margins = np.zeros((rows, claim.cells))
    for c in range(claim.cells):
        x = effect + (claim.sds[c] if claim.sds else 1.0) * noise(dist, (rows, n), rng)
        f = rng.random((rows, n)) < failure
        qs.append([_q(x, f, null, alt, claim.exact, rng, floor) for null, alt in _tests(claim)])
        failed += f.sum(-1)
        with np.errstate(all="ignore"):
            kept = np.where(f, np.nan, x)
            sds[:, c] = np.nanstd(kept, -1, ddof=1)
            k = (~f).sum(-1)
            margins[:, c] = (np.nanmean(kept, -1) - stats.t.ppf(0.975, k - 1) * sds[:, c]
                             / np.sqrt(k)) - claim.target
        # the pilot's q of the test for the claim (equivalence: of both sides of TOST)
        q_for.append(qs[-1][0] if claim.kind != "equivalence"
                     else np.stack([qs[-1][0], qs[-1][1]], -1))
    return qs, failed, sds, np.stack(q_for, 1), margins


def _decide(family: list[Claim], q1: list, q2: list, failed: np.ndarray,
            seeds: np.ndarray) -> np.ndarray:
    """Verdict codes (draws x claims) of a look: each elementary test at ``design_p``, the
    cells' sides, the claim's p (``cells_p``), the paper's family (``family_p``), a failure
    rate shown above FAILURE_LIMIT ("failed runs": p_for 1, the verdict unless against)."""
    ps = []
    for c, cells1, cells2 in zip(family, q1, q2):
        sides = [_sides(c, [design_p(a, b) for a, b in zip(t1, t2)])
                 for t1, t2 in zip(cells1, cells2)]
        ps.append(cells_p(*(np.stack([s[k] for s in sides], -1) for k in range(3))))
    p_for, p_against, p_smaller = (np.stack([p[k] for p in ps], -1) for k in range(3))
    with np.errstate(all="ignore"):
        low = np.where(failed > 0, stats.beta.ppf(0.025, failed, seeds - failed + 1), 0.0)
    bad = low > FAILURE_LIMIT
    p_for = np.where(bad, 1.0, p_for)
    h_for, h_against, h_smaller = family_p(p_for, p_against, p_smaller)
    codes = np.full(p_for.shape, 3)
    against = h_smaller <= ALPHA
    codes[against] = np.where(h_against[against] <= ALPHA, 2, 1)
    codes[h_for <= ALPHA] = 0
    codes[bad & (codes != 1) & (codes != 2)] = 4
    return codes


def hint_seeds(claim: Claim, family: int, pilot: int, sds: np.ndarray,
               q_for: np.ndarray, margins: np.ndarray | None = None) -> np.ndarray:
    """The follow-up's seeds a cell the tool sizes (``claims.seeds_hint``, "sized", before
    the follow-up), per row of the pilot's spreads, q and lower-bound margins (rows x
    cells); -1 out of reach."""
    tost = claim.kind == "equivalence"
    distance = abs(claim.target if tost else claim.claimed - claim.target)
    if margins is None or tost:
        return _hint_at(claim, np.full(len(sds), distance), family, pilot, sds, q_for)
    with np.errstate(invalid="ignore"):
        shown = np.where(np.isfinite(margins).all(-1), margins.min(-1), -np.inf)
    return _hint_at(claim, np.maximum(distance, shown), family, pilot, sds, q_for)


def _hint_at(claim: Claim, effects: np.ndarray, family: int, pilot: int, sds: np.ndarray,
             q_for: np.ndarray) -> np.ndarray:
    """The hint per row at per-row effects; at least BOOTSTRAP_MIN for a bootstrapped claim."""
    tost = claim.kind == "equivalence"
    n = follow_up_seeds_many(effects, sds, pilot, q_for, family, tost,
                             margin=claim.target if tost else None)
    return np.where((n > 0) & claim.exact, np.maximum(n, BOOTSTRAP_MIN), n)


def simulate(family: list[Claim], effects: list[float], draws: int,
             rng: np.random.Generator, *, dist: str = "normal", failure: float = 0.0,
             pilot: int | None = None, budget: int = 200) -> Outcome:
    """Run the design on ``draws`` papers whose claim i has true effect ``effects[i]`` in
    every cell, a pilot of ``pilot`` seeds a cell (None: the design's, ``default_pilot``); a
    follow-up beyond ``budget`` seeds a cell stops for futility."""
    m = len(family)
    pilot = default_pilot(family) if pilot is None else pilot
    stage1 = [_stage(c, e, draws, pilot, dist, failure, rng) for c, e in zip(family, effects)]
    q1 = [s[0] for s in stage1]
    q2 = [[[np.full(draws, np.nan) for _ in cell] for cell in s[0]] for s in stage1]
    failed = np.stack([s[1] for s in stage1], -1)
    seeds = np.stack([np.full(draws, pilot * c.cells) for c in family], -1).astype(float)
    pilot_codes = _decide(family, q1, q2, failed, seeds)
    hints = np.zeros((draws, m), dtype=int)
    for i, (c, e) in enumerate(zip(family, effects)):
        open_ = np.flatnonzero(pilot_codes[:, i] == 3)
        if not len(open_):
            continue
        hints[open_, i] = hint_seeds(c, m, pilot, stage1[i][2][open_], stage1[i][3][open_],
                                     stage1[i][4][open_])
        for n2 in np.unique(hints[open_, i]):
            if n2 <= 0 or n2 > budget:
                continue
            rows = open_[hints[open_, i] == n2]
            qs, f2, _, _, _ = _stage(c, e, len(rows), int(n2), dist, failure, rng)
            for cell, tests in enumerate(qs):
                for t, q in enumerate(tests):
                    q2[i][cell][t][rows] = q
            failed[rows, i] += f2
            seeds[rows, i] += n2 * c.cells
    codes = _decide(family, q1, q2, failed, seeds)
    per_cell = seeds / np.array([c.cells for c in family])
    return Outcome(pilot_codes, codes, per_cell, hints)


def wrong(claim: Claim, effect: float, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (a wrong verdict for the claim, a wrong verdict against it) of each draw: a
    false "reproduced" (the effect at or below the target; equivalence: at or beyond the
    margin), and a false "contradicted" (at or beyond the target; within the margin) or
    "smaller than claimed" (at or beyond the claimed effect; equivalence: no difference)."""
    t, c = claim.target, claim.claimed
    if claim.kind == "equivalence":
        return ((codes == 0) & (abs(effect) >= t),
                ((codes == 2) & (abs(effect) <= t)) | ((codes == 1) & (effect == 0)))
    return ((codes == 0) & (effect <= t),
            ((codes == 2) & (effect >= t)) | ((codes == 1) & (effect >= c)))


def error_rates(family: list[Claim], effects: list[float], outcome: Outcome
                ) -> dict[str, float]:
    """Return the paper's P(a false reproduced), P(a false verdict against a claim), P(any
    wrong verdict), P(every claim decided) and the mean seeds a cell."""
    f, a = zip(*(wrong(c, e, outcome.codes[:, i]) for i, (c, e) in
                 enumerate(zip(family, effects))))
    f, a = np.stack(f, -1).any(-1), np.stack(a, -1).any(-1)
    return {"false_for": float(f.mean()), "false_against": float(a.mean()),
            "any_wrong": float((f | a).mean()),
            "decided": float(np.isin(outcome.codes, (0, 1, 2)).all(-1).mean()),
            "mean_seeds": float(outcome.seeds.mean())}


def delivered_power(claim: Claim, effect: float, draws: int, rng: np.random.Generator,
                    pilot: int | None = None, dist: str = "normal") -> dict[str, float]:
    """Return the power the hint delivers: a claim alone at true ``effect`` whose pilot is
    undecided, followed up at the hint computed for that effect (its distance beyond the
    target; the claimed or the midway effect); P(reproduced at the end) among those, the
    median follow-up, and the same for a fresh fixed look at ``design.fixed_seeds``; a pilot
    of ``pilot`` seeds a cell (None: the design's for a paper of this claim)."""
    pilot = default_pilot([claim]) if pilot is None else pilot
    distance = (effect - claim.target if claim.kind != "equivalence"
                else claim.target - abs(effect))
    stage1 = _stage(claim, effect, draws, pilot, dist, 0.0, rng)
    q2 = [[np.full(draws, np.nan) for _ in cell] for cell in stage1[0]]
    seeds = np.full((draws, 1), float(pilot * claim.cells))
    codes1 = _decide([claim], [stage1[0]], [q2], np.zeros((draws, 1)), seeds)[:, 0]
    open_ = np.flatnonzero(codes1 == 3)
    tost = claim.kind == "equivalence"
    with np.errstate(invalid="ignore"):
        shown = stage1[4][open_].min(-1) if not tost else np.full(len(open_), -np.inf)
    n2 = _hint_at(claim, np.maximum(abs(distance), np.nan_to_num(shown, nan=-np.inf)), 1,
                  pilot, stage1[2][open_], stage1[3][open_])
    ok = n2 > 0
    reproduced = []
    for n in np.unique(n2[ok]):
        rows = open_[ok][n2[ok] == n]
        qs, _, _, _, _ = _stage(claim, effect, len(rows), int(n), dist, 0.0, rng)
        q1_rows = [[q[rows] for q in cell] for cell in stage1[0]]
        codes = _decide([claim], [q1_rows], [qs], np.zeros((len(rows), 1)),
                        np.full((len(rows), 1), 1.0))[:, 0]
        reproduced += list(codes == 0)
    fixed = fixed_seeds_many(abs(distance), stage1[2][open_], pilot, tost=tost,
                             margin=claim.target if tost else None)
    fixed_hit = []
    for n in np.unique(fixed[fixed > 0]):
        count = int(np.sum(fixed == n))
        qs, _, _, _, _ = _stage(claim, effect, count, int(n), dist, 0.0, rng,
                                SKEW_SHIFT_MIN_N)
        # a fixed look: its own q at the full alpha (design_p's share 1: q1 / 1)
        codes = _decide_fixed(claim, qs)
        fixed_hit += list(codes == 0)
    return {"follow_up": float(np.mean(reproduced)) if reproduced else math.nan,
            "median_follow_up": float(np.median(n2[ok])) if ok.any() else math.nan,
            "out_of_reach": float(np.mean(~ok)) if len(ok) else math.nan,
            "fixed": float(np.mean(fixed_hit)) if fixed_hit else math.nan,
            "median_fixed": float(np.median(fixed[fixed > 0])) if (fixed > 0).any()
            else math.nan}


def _decide_fixed(claim: Claim, qs: list[list[np.ndarray]]) -> np.ndarray:
    """Verdict codes of a claim alone at one fixed look (full alpha)."""
    sides = [_sides(claim, tests) for tests in qs]
    p_for, _, _ = cells_p(*(np.stack([s[k] for s in sides], -1) for k in range(3)))
    return np.where(p_for <= ALPHA, 0, 3)


#: the papers' families as the specs declare them (diagnostics left out), in units of the
#: cells' standard deviation: a target at half a standard deviation and a claimed effect at
#: one (a margin of half a standard deviation)
FAMILIES: dict[str, list[Claim]] = {
    "bounded adaptive clipping": [Claim()] * 6,
    "FIBER": [Claim(cells=4)] * 3 + [Claim()] * 2,
    "DP-IVON": [Claim("non_inferiority", 1, -0.5, 0.0), Claim(), Claim()],
    "spectral denoising": [Claim(cells=2, exact=True)],
    "DP-aware AdaLN-Zero": [Claim(cells=3), Claim("equivalence", 1, 0.5, 0.0)],
}
#: one claim of each kind, for the power tables
KINDS: dict[str, Claim] = {
    "superiority": Claim(), "every cell (4)": Claim(cells=4),
    "every cell (4), one SD 4x": Claim(cells=4, sds=(1.0, 0.25, 0.25, 0.25)),
    "every cell (4), SDs 2:1:1:1": Claim(cells=4, sds=(1.0, 0.5, 0.5, 0.5)),
    "every cell (4), SDs 1:.3:.3:.3": Claim(cells=4, sds=(1.0, 0.3, 0.3, 0.3)),
    "every cell (4), SDs 1.5:1.2:1:.8": Claim(cells=4, sds=(1.0, 0.8, 2 / 3, 0.8 / 1.5)),
    "non-inferiority": Claim("non_inferiority", 1, -0.5, 0.0),
    "equivalence": Claim("equivalence", 1, 0.5, 0.0),
    "steps (bootstrap)": Claim(cells=2, exact=True),
}


def truths(family: list[Claim], which: str) -> list[float]:
    """The least favourable true effects: ``target`` (every claim at its target: a false
    "reproduced" and a false "contradicted" both possible; equivalence at its margin),
    ``claimed`` (every claim at its claimed effect: a false "smaller than claimed";
    equivalence at no difference), ``mixed`` (alternately)."""
    at_target = [c.target for c in family]
    at_claimed = [c.claimed for c in family]
    if which == "target":
        return at_target
    if which == "claimed":
        return at_claimed
    return [t if i % 2 == 0 else c for i, (t, c) in enumerate(zip(at_target, at_claimed))]


DISTS = ("normal", "right", "left", "heavy")


def report(draws: int = 4000, seed: int = 40, failure: float = 0.02,
           families: dict[str, list[Claim]] | None = None,
           exact_draws: int | None = None, power_draws: int | None = None,
           power: bool = True, which_truths: tuple[str, ...] = ("target", "mixed", "claimed"),
           kinds: tuple[str, ...] | None = None, pilot: int | None = None) -> str:
    """Return the operating characteristics as markdown, pilots of ``pilot`` seeds a cell
    (None: the design's for each family and kind, ``default_pilot``): per paper family,
    truth and gain distribution (each seed failing with probability ``failure``), P(false
    reproduced), P(false against), P(any wrong verdict), P(every claim decided) within the
    budget and the mean seeds a cell; then the hint's delivered power (``kinds``: those of
    KINDS, None: every one). ``exact_draws``: the draws of a family with a bootstrapped claim (its
    resampling is the slow part); ``families`` None: every one, {}: none."""
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    families = FAMILIES if families is None else families
    lines = ["| paper family (claims) | truth | gains | draws | P(false reproduced) | "
             "P(false against) | P(any wrong) | P(all decided) | mean seeds a cell |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, family in families.items():
        n = exact_draws if exact_draws and any(c.exact for c in family) else draws
        for which in which_truths:
            effects = truths(family, which)
            for dist in DISTS:
                rates = error_rates(family, effects, simulate(
                    family, effects, n, rng, dist=dist, failure=failure, pilot=pilot))
                lines.append(f"| {name} ({len(family)}) | {which} | {dist} | {n} | "
                             f"{rates['false_for']:.4f} | {rates['false_against']:.4f} | "
                             f"{rates['any_wrong']:.4f} | {rates['decided']:.3f} | "
                             f"{rates['mean_seeds']:.1f} |")
    if not power:
        return "\n".join(lines) + "\n"
    lines += ["", "| kind | effect the hint is for | delivered (follow-up) | median follow-up "
              "| hint out of reach | delivered (fresh fixed look) | median fixed n |",
              "|---|---|---|---|---|---|---|"]
    for name, claim in KINDS.items():
        if claim.exact or (kinds is not None and name not in kinds):
            continue
        for label, effect in (("claimed", claim.claimed),
                              ("midway", (claim.claimed + claim.target) / 2)):
            if claim.kind == "equivalence":
                effect = 0.0 if label == "claimed" else claim.target / 2
            got = delivered_power(claim, effect, power_draws or draws, rng, pilot)
            lines.append(f"| {name} | {label} | {got['follow_up']:.3f} | "
                         f"{got['median_follow_up']:.0f} | {got['out_of_reach']:.3f} | "
                         f"{got['fixed']:.3f} | {got['median_fixed']:.0f} |")
    return "\n".join(lines) + "\n"
