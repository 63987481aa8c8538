"""The verdict rules: a claim's verdict from its p-values, over the cells of an "at every"
claim and within a paper's family (docs/tuning-and-claims.md, "Verdict rules"). Every
function here works on fixed numbers; the simulation of ``operating`` calls the same ones
over draws."""

from __future__ import annotations

import numpy as np

from dpbench.analysis.stats import ALPHA

VERDICTS = ("reproduced", "smaller than claimed", "contradicted", "underpowered", "failed runs",
            "not run")
#: the verdicts against a claim (decided by the tests of the claimed effect and the target)
AGAINST = ("smaller than claimed", "contradicted")
#: the fewest seeds (values) a cell is tested on: two values decide nothing (their spread
#: is one number's worth of evidence, and two near-equal gains would decide with p ~ 0.02)
MIN_VALUES = 3


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
    difference is shown, not one beyond the margin), underpowered otherwise."""
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
    """Return the verdict from the claim's three p-values (ALPHA scale, adjusted within a
    paper): reproduced when the test for the claim rejects at ``level``; otherwise
    contradicted when the tests of the claimed effect and of the target both reject, smaller
    than claimed when only the first does; underpowered otherwise."""
    if p_for <= level:
        return "reproduced"
    if p_smaller <= level:
        return "contradicted" if p_against <= level else "smaller than claimed"
    return "underpowered"


def cells_p(p_for: np.ndarray, p_against: np.ndarray,
            p_smaller: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return a claim's p-values from its cells' (cells on the last axis): the claim holds
    only if every cell does (intersection-union: its p is the largest cell's), and fails if
    any cell does (a union: the smallest cell p times the cells, Bonferroni). The claimed
    effect lies beyond the target, so rejecting the target rejects it too: p_smaller is at
    most p_against (closure)."""
    k = np.asarray(p_for).shape[-1]
    against = np.minimum(1.0, k * np.min(p_against, axis=-1))
    smaller = np.minimum(1.0, k * np.min(p_smaller, axis=-1))
    return np.max(p_for, axis=-1), against, np.fmin(smaller, against)


def holm_rows(p: np.ndarray) -> np.ndarray:
    """Return Holm's step-down adjusted p-values of each row of ``p`` (claims on the last
    axis; NaN is not in the family and stays NaN). Equal to ``stats.holm`` on each row."""
    p = np.atleast_2d(np.asarray(p, dtype=float))
    finite = ~np.isnan(p)
    m = finite.sum(-1, keepdims=True)
    order = np.argsort(np.where(finite, p, np.inf), axis=-1, kind="stable")
    ranked = np.take_along_axis(np.where(finite, p, 0.0), order, -1) \
        * np.maximum(m - np.arange(p.shape[-1]), 1)
    out = np.empty_like(p)
    np.put_along_axis(out, order, np.minimum(1.0, np.maximum.accumulate(ranked, axis=-1)), -1)
    return np.where(finite, out, np.nan)


def family_p(p_for: np.ndarray, p_against: np.ndarray,
             p_smaller: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return the adjusted (for, against, claimed effect) p-values of a paper's claims (claims
    on the last axis), two families of 2.5 % each, so a paper's chance of any wrong verdict
    is at most 5 %:

    - for: Holm over the claims' p_for;
    - against: one family for "contradicted" and "smaller than claimed" together. A claim's
      claimed effect lies beyond its target, so "the gain reaches the claimed effect" is
      true only where "the gain reaches the target" is; the closed test of these nested
      hypotheses with Bonferroni intersections (a restricted family, Shaffer 1986) rejects
      "reaches the target" of claim i when Holm over the p_against rejects it, and "reaches
      the claimed effect" of claim i when Holm over the p_against, claim i's replaced by its
      p_smaller, rejects claim i.
    """
    p_against = np.atleast_2d(np.asarray(p_against, dtype=float))
    p_smaller = np.atleast_2d(np.asarray(p_smaller, dtype=float))
    smaller = np.empty_like(p_smaller)
    for i in range(p_smaller.shape[-1]):
        swapped = p_against.copy()
        swapped[..., i] = np.fmin(p_smaller[..., i], p_against[..., i])
        smaller[..., i] = holm_rows(swapped)[..., i]
    return holm_rows(p_for), holm_rows(p_against), smaller
