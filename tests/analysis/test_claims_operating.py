"""The operating characteristics of the verdict rules (docs/tuning-and-claims.md,
"Operating characteristics"): the vectorised simulation decides as the claims table does,
and, re-simulated (slow), the error budget, the power at the hinted seeds and convergence."""

from __future__ import annotations

import numpy as np
import pytest

from dpbench.analysis import operating
from dpbench.analysis.claims import adjust, evaluate_claim
from dpbench.analysis.operating import CODES, FAMILIES, KINDS, Claim


def _records(gains, eps):
    return [r for s, g in enumerate(gains) for r in (
        {"status": "completed", "method_name": "a", "seed": s, "target_epsilon": eps,
         "metrics": {"accuracy": 0.5 + g}},
        {"status": "completed", "method_name": "b", "seed": s, "target_epsilon": eps,
         "metrics": {"accuracy": 0.5}})]


SPECS = {  # the simulation's claims as specs (a standard deviation of 1 in accuracy units)
    Claim(): {"paper_effect": 1.0},
    Claim(cells=2): {"paper_effect": 1.0},
    Claim("non_inferiority", 1, -0.5, 0.0): {"kind": "non_inferiority", "margin": 0.5},
    Claim("equivalence", 1, 0.5, 0.0): {"kind": "equivalence", "margin": 0.5},
}


def test_the_simulation_decides_as_the_claims_table():
    rng = np.random.default_rng(np.random.SeedSequence(35))
    family = list(SPECS)
    for draw in range(6):
        n = (3, 5, 10)[draw % 3]
        effects = rng.choice([-0.5, 0.0, 0.5, 1.0, 1.5], len(family))
        rows, p = [], []
        for i, (claim, effect) in enumerate(zip(family, effects)):
            eps = [1.0 + c for c in range(claim.cells)]
            x = rng.normal(effect, 1.0, (claim.cells, n))
            spec = {"id": f"c{i}", "claim": "a vs b", "metric": "accuracy", "method": "a",
                    "baseline": "b", "where": {"target_epsilon": eps if claim.cells > 1
                                               else eps[0]}, **SPECS[claim]}
            runs = [r for c in range(claim.cells) for r in _records(x[c], eps[c])]
            rows.append({**evaluate_claim(spec, runs), "paper": "P"})
            p.append(operating.claim_p([operating.cell_p(x[c][None], claim)
                                        for c in range(claim.cells)]))
        codes = operating.family_verdicts(*(np.array([[q[j][0] for q in p]])
                                            for j in range(3)))[0]
        assert [r["verdict"] for r in adjust(rows)] == [CODES[c] for c in codes]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_papers_family_keeps_its_error_budget(name):
    """P(a false reproduced) and P(a false contradicted) at most 2.5 % each, at the least
    favourable effects, n = 3, 5, 10 (4000 draws: a standard error of 0.0025; bound 0.032)."""
    rng = np.random.default_rng(np.random.SeedSequence([35, len(name)]))
    for n in (3, 5, 10):
        reproduced, contradicted, smaller = operating.false_rates(FAMILIES[name], n, 4000, rng)
        assert reproduced <= 0.032 and contradicted <= 0.032 and smaller <= 0.032, (n, name)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["superiority", "every cell (4)", "non-inferiority",
                                  "equivalence"])
def test_the_hint_decides_a_claim_at_its_claimed_effect(kind):
    """From a pilot of 3 seeds, the hinted n decides the claim (family of 5, the others
    undecided) with probability at least 0.8 when the true effect is the claimed one."""
    rng = np.random.default_rng(np.random.SeedSequence([35, len(kind)]))
    decided, _ = operating.decided_at_hint(KINDS[kind], 5, 3, 400, rng)
    assert decided >= 0.8


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_underpowered_vanishes_as_the_seeds_grow(kind):
    """Every true effect, including the target and the claimed effect themselves, is decided
    with enough seeds: P(underpowered) below 1 % at n = 320 (and falling)."""
    claim = KINDS[kind]
    rng = np.random.default_rng(np.random.SeedSequence([35, len(kind), 1]))
    for effect in (claim.target - 0.5, claim.target, (claim.target + claim.claimed) / 2,
                   claim.claimed, claim.claimed + 0.5, -claim.target):
        rates = [operating.underpowered(claim, effect, n, 500, rng) for n in (20, 320)]
        assert rates[1] <= 0.01 and rates[1] <= rates[0], (effect, rates)
