"""The one-run audit's statistics (Steinke, Nasr, Jagielski 2023, arXiv 2305.08846).

m canaries are each included independently with probability 1/2; the auditor guesses the
inclusion of r of them (abstaining on the rest) and gets v right. Under the null hypothesis
that the mechanism is (epsilon, delta)-DP, Theorem 5.2 bounds P[>= v correct] by the tail of
Binomial(r, e^eps / (1 + e^eps)) plus a delta term (the paper's Algorithm 3 / Appendix D code,
reimplemented with scipy). epsilon_lower is the largest epsilon rejected at level 1 - confidence.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats


def p_value_dp_audit(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Return P[>= v of r guesses correct] under an (epsilon, delta)-DP null (Thm 5.2)."""
    if not (0 <= v <= r <= m) or epsilon < 0 or not (0 <= delta <= 1):
        raise ValueError(f"invalid audit outcome m={m} r={r} v={v} eps={epsilon} delta={delta}")
    q = 1.0 / (1.0 + math.exp(-epsilon))  # accuracy of epsilon-DP randomised response
    beta = float(stats.binom.sf(v - 1, r, q))  # P[Binomial(r, q) >= v]
    if v == 0:
        return 1.0
    # alpha = max_i P[v > Binomial(r, q) >= v - i] / i, i = 1..v
    tail = np.cumsum(stats.binom.pmf(np.arange(v - 1, -1, -1), r, q))
    alpha = float(np.max(tail / np.arange(1, v + 1)))
    return min(beta + alpha * delta * 2 * m, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float,
                        confidence: float = 0.95, iterations: int = 40) -> float:
    """Return the largest epsilon whose null the outcome rejects at ``confidence`` (0 if none)."""
    p = 1.0 - confidence
    if p_value_dp_audit(m, r, v, 0.0, delta) >= p:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value_dp_audit(m, r, v, hi, delta) < p:
        lo, hi = hi, hi * 2
        if hi > 1e3:
            return math.inf
    for _ in range(iterations):  # bisection on the monotone p-value
        mid = (lo + hi) / 2
        if p_value_dp_audit(m, r, v, mid, delta) < p:
            lo = mid
        else:
            hi = mid
    return lo


def audit_power(m: int, r: int, delta: float, confidence: float = 0.95) -> float:
    """Return the largest epsilon_lower an audit with m canaries and r guesses can certify.

    That is the bound when all r guesses are right: a mechanism leaking more than this cannot
    be told apart from one that leaks exactly this much. At delta = 1e-5 and 95% confidence,
    200 guesses give 4.17 and no number of guesses exceeds about 8.3 (the 2 m delta term of
    Thm 5.2 grows with m as fast as the binomial tail shrinks).
    """
    return epsilon_lower_bound(m, r, r, delta, confidence)


#: canary counts ``audit.canaries=auto`` chooses from (smallest that suffices)
CANARY_LADDER = (1000, 2000, 5000, 10000, 20000, 30000, 40000)
#: ``auto`` sizing leaves this many wrong guesses of slack above the claimed epsilon
TOLERATED_WRONG_GUESSES = 2


def auto_guesses(m: int) -> int:
    """Return guesses per side (included and excluded) for m canaries: all but a margin.

    Each side guesses m/2 minus three standard deviations of the number of included canaries
    (Binomial(m, 1/2)), so a broken mechanism's top and bottom scores are all right.
    """
    return max(m // 2 - math.ceil(1.5 * math.sqrt(m)), 1)


def auto_canaries(claimed_epsilon: float, delta: float, confidence: float = 0.95) -> int:
    """Return the fewest canaries (from ``CANARY_LADDER``) able to detect a mechanism that
    leaks more than ``claimed_epsilon``, with ``TOLERATED_WRONG_GUESSES`` wrong guesses.

    Falls back to the largest count when none can (the reported power then says so).
    """
    for m in CANARY_LADDER:
        r = 2 * auto_guesses(m)
        if epsilon_lower_bound(m, r, r - TOLERATED_WRONG_GUESSES, delta,
                               confidence) > claimed_epsilon:
            return m
    return CANARY_LADDER[-1]
