"""Operating characteristics of the claims' verdict rules, by Monte Carlo with known truth
(docs/tuning-and-claims.md, "Operating characteristics").

The rules of ``dpbench.analysis.claims`` vectorised over draws: each cell's values are
normal with standard deviation 1, each claim's p-values are those ``claims._test`` computes
(t tests, TOST for equivalence), combined over cells as ``claims._claim_p`` and decided
within a paper family as ``claims.adjust`` (Holm on both sides). A test checks that these
verdicts equal ``evaluate_claim`` + ``adjust`` on the same draws.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from dpbench.analysis.stats import (
    ALPHA,
    EXACT_MAX_N,
    POWER,
    exact_min_n,
    sd_upper_bound,
    seeds_for_power,
)

CODES = ("reproduced", "smaller than claimed", "contradicted", "underpowered")


@dataclass(frozen=True)
class Claim:
    """A claim of the simulation: its kind, cells, and its target and claimed effect in
    units of the cells' standard deviation (equivalence: target = the margin)."""

    kind: str = "superiority"   # superiority (also interaction, threshold), non_inferiority,
    cells: int = 1              # equivalence
    target: float = 0.5
    claimed: float = 1.0
    exact: bool = False         # the sign-flip test (steps savings)


def _p(x: np.ndarray, null: float, alternative: str, exact: bool = False) -> np.ndarray:
    """One-sample t test p-values over the last axis (draws x n); with ``exact`` the
    sign-flip test, all 2^n flips (``stats.sign_flip_p``)."""
    n = x.shape[-1]
    if exact:
        d = x - null
        if n <= EXACT_MAX_N:
            flips = 1 - 2 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)
        else:  # as sign_flip_p beyond EXACT_MAX_N: random flips (fewer here), the data's own
            flips = np.vstack([np.ones(n), np.random.default_rng(n).choice([-1, 1], (999, n))])
        means, observed = d @ flips.T / n, d.mean(-1, keepdims=True)
        tol = 1e-12 * np.abs(d).max(-1, keepdims=True)
        hits = means >= observed - tol if alternative == "greater" else means <= observed + tol
        return hits.mean(-1)
    t = (x.mean(-1) - null) / (x.std(-1, ddof=1) / np.sqrt(n))
    return stats.t.sf(t, n - 1) if alternative == "greater" else stats.t.cdf(t, n - 1)


def cell_p(x: np.ndarray, claim: Claim) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (p_for, p_against, p_smaller) of each draw's cell, on the ALPHA scale."""
    if claim.exact:
        return (np.minimum(1, 2 * _p(x, claim.target, "greater", True)),
                np.minimum(1, 2 * _p(x, claim.target, "less", True)),
                np.minimum(1, 2 * _p(x, claim.claimed, "less", True)))
    if claim.kind == "equivalence":
        m = claim.target
        return (np.minimum(1, 2 * np.maximum(_p(x, -m, "greater"), _p(x, m, "less"))),
                np.minimum(1, 2 * np.minimum(_p(x, m, "greater"), _p(x, -m, "less"))),
                np.minimum(1, 4 * np.minimum(_p(x, 0, "greater"), _p(x, 0, "less"))))
    return (np.minimum(1, 2 * _p(x, claim.target, "greater")),
            np.minimum(1, 2 * _p(x, claim.target, "less")),
            np.minimum(1, 2 * _p(x, claim.claimed, "less")))


def claim_p(draws: list[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    """Combine the cells' p-values: the largest p_for, the smallest p against times k."""
    k = len(draws)
    p_for = np.max([d[0] for d in draws], axis=0)
    return (p_for, np.minimum(1, k * np.min([d[1] for d in draws], axis=0)),
            np.minimum(1, k * np.min([d[2] for d in draws], axis=0)))


def holm_matrix(p: np.ndarray) -> np.ndarray:
    """Return Holm-adjusted p-values, row by row (``stats.holm`` on each row)."""
    m = p.shape[1]
    order = np.argsort(p, axis=1, kind="stable")
    ranked = np.take_along_axis(p, order, 1) * (m - np.arange(m))
    adjusted = np.empty_like(p)
    np.put_along_axis(adjusted, order, np.minimum(1, np.maximum.accumulate(ranked, axis=1)), 1)
    return adjusted


def family_verdicts(p_for: np.ndarray, p_against: np.ndarray,
                    p_smaller: np.ndarray) -> np.ndarray:
    """Return verdict codes (indices into CODES), draws x claims, decided as ``adjust``."""
    holm_for, holm_against, holm_smaller = (holm_matrix(p) for p in (p_for, p_against,
                                                                     p_smaller))
    out = np.full(p_for.shape, 3)
    against = holm_smaller <= ALPHA
    out[against] = np.where(holm_against[against] <= ALPHA, 2, 1)
    out[holm_for <= ALPHA] = 0
    return out


def simulate(family: list[Claim], effects: list[float], n: int, draws: int,
             rng: np.random.Generator) -> np.ndarray:
    """Return verdict codes (draws x claims) of ``family`` when every cell of claim i has
    true mean ``effects[i]`` and n seeds."""
    ps = []
    for claim, effect in zip(family, effects):
        cells = [cell_p(rng.normal(effect, 1.0, (draws, n)), claim) for _ in range(claim.cells)]
        ps.append(claim_p(cells))
    return family_verdicts(*(np.stack([p[j] for p in ps], axis=1) for j in range(3)))


def hint(claim: Claim, sd: np.ndarray, n: int, family: int) -> np.ndarray:
    """Return ``claims.seeds_hint`` for pilots of ``n`` seeds with cell spreads ``sd``
    (pilots x cells); 1001 where out of reach."""
    alpha = ALPHA / 2 / family
    effect = claim.target if claim.kind == "equivalence" else claim.claimed - claim.target
    min_n = max(n + 1, exact_min_n(alpha)) if claim.exact else n + 1
    out = []
    for row in np.atleast_2d(sd):
        got = seeds_for_power([sd_upper_bound(float(s), n) for s in row], effect, alpha, POWER,
                              tost=claim.kind == "equivalence", min_n=min_n)
        out.append(got if got is not None else 1001)
    return np.asarray(out)


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
#: one claim of each kind, for the power and convergence tables
KINDS: dict[str, Claim] = {
    "superiority": Claim(), "every cell (4)": Claim(cells=4),
    "non-inferiority": Claim("non_inferiority", 1, -0.5, 0.0),
    "equivalence": Claim("equivalence", 1, 0.5, 0.0),
    "steps (exact)": Claim(cells=2, exact=True),
}


def false_rates(family: list[Claim], n: int, draws: int,
                rng: np.random.Generator) -> tuple[float, float, float]:
    """Return P(some claim falsely reproduced), P(some claim falsely contradicted) with every
    claim's true effect at its target (the least favourable effect for both: reproduced is
    false at or below it, contradicted at or above it; for equivalence the margin), and
    P(some claim falsely smaller than claimed) with every effect at the claimed one."""
    codes = simulate(family, [c.target for c in family], n, draws, rng)
    claimed = simulate(family, [c.claimed for c in family], n, draws, rng)
    return (float(np.mean((codes == 0).any(1))), float(np.mean((codes == 2).any(1))),
            float(np.mean((claimed == 1).any(1))))


def decided_at_hint(claim: Claim, family: int, pilot_n: int, pilots: int,
                    rng: np.random.Generator) -> tuple[float, float]:
    """Return (P(decided), median hinted n): a pilot of ``pilot_n`` seeds at the claimed
    effect (no difference for equivalence) gives a hint; a fresh run at the hinted n is
    decided within a family of ``family`` claims whose others decide nothing (the claim at
    Holm's first level)."""
    effect = 0.0 if claim.kind == "equivalence" else claim.claimed
    sd = np.stack([rng.normal(effect, 1.0, (pilots, pilot_n)).std(-1, ddof=1)
                   for _ in range(claim.cells)], axis=1)
    hints = hint(claim, sd, pilot_n, family)
    decided: list[bool] = []
    others = [Claim()] * (family - 1)
    for n in np.unique(hints[hints <= 1000]):
        count = int(np.sum(hints == n))
        codes = simulate([claim, *others], [effect] + [0.75] * (family - 1), int(n), count, rng)
        decided += list(codes[:, 0] != 3)
    decided += [False] * int(np.sum(hints > 1000))
    return float(np.mean(decided)), float(np.median(hints))


def underpowered(claim: Claim, effect: float, n: int, draws: int,
                 rng: np.random.Generator) -> float:
    """Return P(underpowered) of a claim alone with true effect ``effect`` and n seeds."""
    return float(np.mean(simulate([claim], [effect], n, draws, rng)[:, 0] == 3))
