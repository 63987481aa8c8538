"""The one-run audit's statistics: two bounds from the same guesses.

m canaries are each included independently with probability 1/2; the auditor guesses the
inclusion of r of them (abstaining on the rest) and gets v right.

- ``epsilon_lower_bound`` (Steinke, Nasr, Jagielski 2023, arXiv 2305.08846): under the null
  hypothesis that the mechanism is (epsilon, delta)-DP, Theorem 5.2 bounds P[>= v correct] by
  the tail of Binomial(r, e^eps / (1 + e^eps)) plus a delta term (the paper's Algorithm 3 /
  Appendix D code, reimplemented with scipy). epsilon_lower is the largest epsilon rejected at
  level 1 - confidence.
- ``epsilon_lower_bound_fdp`` (Mahloujifar, Melis, Chaudhuri 2024, arXiv 2410.22235): the
  null is that the mechanism is f-DP for the Gaussian trade-off curve f = G_mu whose
  (epsilon, delta) curve passes through (epsilon, delta) (the privacy curve of DP-SGD's
  Gaussian noise); their guessing-game recursion bounds the probability of v correct guesses
  under f directly, which is tighter than going through one (epsilon, delta) pair. The bound
  is therefore about mechanisms with a Gaussian-shaped trade-off curve (what the accountant
  of a Gaussian mechanism assumes), not about every (epsilon, delta)-DP mechanism. Its null
  is also rejected where SNJ's test rejects (epsilon, delta)-DP, so on the same guesses it is
  never below ``epsilon_lower_bound`` (why this keeps the level: its docstring).

The ``*_power`` functions give each bound's ceiling: its value when every guess is right,
the highest epsilon_lower any attack can reach with m canaries and r guesses.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import stats
from scipy.special import ndtr, ndtri


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


@functools.lru_cache(maxsize=4096)
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


@functools.lru_cache(maxsize=256)
def _gaussian_mu(epsilon: float, delta: float) -> float:
    """Return mu of the Gaussian trade-off curve G_mu that is exactly (epsilon, delta)-DP
    (``dp_accounting.get_sigma_gaussian``: the noise of a sensitivity-1 Gaussian, mu = 1/sigma;
    Balle and Wang 2018)."""
    import dp_accounting

    sigma = dp_accounting.get_sigma_gaussian(epsilon, delta)
    return math.inf if sigma == 0 else 1.0 / sigma


def fdp_rejects(m: int, r: int, v: int, epsilon: float, delta: float,
                confidence: float = 0.95) -> bool:
    """Return whether v of r right guesses (of m canaries) reject, at ``confidence``, the null
    that the mechanism is G_mu-DP with mu from (epsilon, delta) (``_gaussian_mu``).

    Mahloujifar, Melis, Chaudhuri 2024 (the recursion of their Algorithm for reconstruction
    games with a cap, as jax_privacy's auditor runs it): starting from r_v = tau v / m and
    h_v = tau (r - v) / m (tau = 1 - confidence), for i = v - 1, ..., 0 set
    h <- max(h, 1 - f(1 - r)) = max(h, Phi(Phi^-1(r) - mu)) and
    r <- min(r + i / (r_guesses - i) (h_new - h_old), 1); the null is rejected when
    r + h > r_guesses / m at the end (the mass the
    recursion forces onto the guesses exceeds their share).
    """
    if not (0 <= v <= r <= m) or r == 0:
        raise ValueError(f"invalid audit outcome m={m} r={r} v={v}")
    mu = _gaussian_mu(epsilon, delta)
    tau = 1.0 - confidence
    right, wrong = tau * v / m, tau * (r - v) / m
    for i in range(v - 1, -1, -1):
        grown = max(wrong, 1.0 if math.isinf(mu) else float(ndtr(ndtri(right) - mu)))
        if grown == wrong:  # a fixed point: neither value changes any more
            break
        right = min(right + i / (r - i) * (grown - wrong), 1.0)
        wrong = grown
    return right + wrong > r / m


@functools.lru_cache(maxsize=4096)
def epsilon_lower_bound_fdp(m: int, r: int, v: int, delta: float,
                            confidence: float = 0.95, iterations: int = 40) -> float:
    """Return the largest epsilon whose Gaussian f-DP null the outcome rejects at
    ``confidence`` (0 if none).

    The null "the mechanism is G_mu-DP, mu from (epsilon, delta)" is rejected when the
    recursion rejects it (``fdp_rejects``) or when Steinke, Nasr and Jagielski's test rejects
    (epsilon, delta)-DP (``p_value_dp_audit``). Both tests are valid for this null: a G_mu-DP
    mechanism is (epsilon, delta)-DP (its (epsilon, delta) curve passes through the pair;
    Dong, Roth, Su 2019, Cor. 2.13), so Thm 5.2 bounds its P[>= v right] too. No union bound
    is needed, because both tests read the same statistic, the number v of right guesses
    among the same r fixed in advance, and each rejects on an upper tail of it whose
    probability under the null its theorem bounds by 1 - confidence; the union of two upper
    tails is the larger of them, so the combined test keeps that level. Each test rejects a
    down-set of epsilons, so the largest epsilon the combined test rejects is the larger of
    the two bounds. The combination matters just above chance, where the recursion's tail
    bound is looser than SNJ's binomial tail (at epsilon -> 0 with 26 of 40 right: 0.0455
    against the exact Binomial(40, 1/2) tail 0.0404); above that the recursion is higher.
    """
    return max(_recursion_bound(m, r, v, delta, confidence, iterations),
               epsilon_lower_bound(m, r, v, delta, confidence))


def _recursion_bound(m: int, r: int, v: int, delta: float, confidence: float,
                     iterations: int) -> float:
    """Return the largest epsilon ``fdp_rejects`` rejects (0 if none; bisection on the
    monotone test)."""
    if r == 0 or not fdp_rejects(m, r, v, 1e-9, delta, confidence):
        return 0.0
    lo, hi = 1e-9, 1.0
    while fdp_rejects(m, r, v, hi, delta, confidence):
        lo, hi = hi, hi * 2
        if hi > 1e3:
            return math.inf
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if fdp_rejects(m, r, v, mid, delta, confidence):
            lo = mid
        else:
            hi = mid
    return lo


def audit_power_fdp(m: int, r: int, delta: float, confidence: float = 0.95) -> float:
    """Return the f-DP bound's ceiling: ``epsilon_lower_bound_fdp`` with every guess right."""
    return epsilon_lower_bound_fdp(m, r, r, delta, confidence)


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
#: ``auto`` tries the excluded side's guesses at these fractions of its maximum
_EXCLUDED_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)


def unsampled_probability(sample_rate: float, steps: int, bands: int = 1) -> float:
    """Return the probability that an included canary joins none of the run's steps.

    Canaries are Poisson-sampled like data: each step includes an included canary with
    probability q (cyclic Poisson over b bands: b q, on every b-th step only, at least
    T // b steps), so it is never sampled with probability (1 - b q)^(T // b): e^-1 = 0.37
    after one epoch, e^-2 = 0.14 after two. Such a canary leaves no trace in any release, so no
    auditor can tell it from an excluded one, however broken the mechanism.
    """
    rate = min(1.0, bands * sample_rate)
    return float((1.0 - rate) ** (steps // max(bands, 1)))


def expected_wrong_guesses(m: int, k_in: int, k_out: int, unsampled: float) -> float:
    """Return the expected wrong guesses of a fully leaking mechanism (noise off).

    With the noise off, the sampled included canaries (m/2 (1 - p) of them, p the unsampled
    probability) have positive scores and the rest score exactly 0: the m/2 excluded ones
    and the m/2 p unsampled included ones, indistinguishable. The top k+ guesses are right
    while they stay among the sampled ones; any excess, and each bottom guess, falls in the
    zero-score pool, where a canary is included with probability p / (1 + p).
    """
    seen = m / 2 * (1.0 - unsampled)
    included_share = unsampled / (1.0 + unsampled)  # of the zero-score pool
    return (max(0.0, k_in - seen) * (1.0 - included_share) + k_out * included_share)


def reachable_power(m: int, k_in: int, k_out: int, delta: float, confidence: float = 0.95,
                    unsampled: float = 0.0) -> float:
    """Return the epsilon_lower a fully leaking mechanism is expected to reach: the audit's
    stated power, accounting for the canaries Poisson sampling never includes in a step.

    ``audit_power`` assumes every guess can be right; with unsampled included canaries some
    cannot, and this is the bound at the expected number of right guesses.
    """
    r = k_in + k_out
    if r == 0:
        return 0.0
    wrong = round(expected_wrong_guesses(m, k_in, k_out, unsampled))
    return epsilon_lower_bound(m, r, max(r - wrong, 0), delta, confidence)


def auto_included_guesses(m: int, unsampled: float = 0.0) -> int:
    """Return k+ for m canaries: the expected number of sampled included canaries
    (Binomial(m, (1 - p) / 2)) minus three standard deviations, so that with the noise off
    every top guess is a sampled included canary."""
    share = (1.0 - unsampled) / 2
    return max(math.floor(m * share - 3 * math.sqrt(m * share * (1 - share))), 1)


def auto_guesses(m: int) -> int:
    """Return guesses per side (included and excluded) for m canaries: all but a margin.

    Each side guesses m/2 minus three standard deviations of the number of included canaries
    (Binomial(m, 1/2)), so a broken mechanism's top and bottom scores are all right.
    """
    return max(m // 2 - math.ceil(1.5 * math.sqrt(m)), 1)


def auto_guess_counts(m: int, delta: float, confidence: float = 0.95,
                      unsampled: float = 0.0, k_in: int | None = None,
                      k_out: int | None = None) -> tuple[int, int]:
    """Return (k+, k-) for m canaries, each side ``auto`` unless given.

    k+ stops short of the sampled included canaries (``auto_included_guesses``); k- is the
    count, among fractions of ``auto_guesses(m)``, with the highest ``reachable_power``: all of
    them in a long run, none after an epoch or two, where a bottom guess is often an included
    canary that was never sampled.
    """
    if k_in is None:
        k_in = auto_included_guesses(m, unsampled)
    if k_out is not None:
        return k_in, k_out
    counts = sorted({math.floor(f * auto_guesses(m)) for f in _EXCLUDED_FRACTIONS})
    if k_in == 0:
        counts = [c for c in counts if c > 0] or [1]
    best = max(counts, key=lambda c: (reachable_power(m, k_in, c, delta, confidence,
                                                      unsampled), -c))
    return k_in, best


def auto_canaries(claimed_epsilon: float, delta: float, confidence: float = 0.95,
                  unsampled: float = 0.0) -> int:
    """Return the fewest canaries (from ``CANARY_LADDER``) able to detect a mechanism that
    leaks more than ``claimed_epsilon``, with ``TOLERATED_WRONG_GUESSES`` wrong guesses beyond
    those the unsampled canaries make (``expected_wrong_guesses``).

    Falls back to the largest count when none can (the reported power then says so).
    """
    for m in CANARY_LADDER:
        k_in, k_out = auto_guess_counts(m, delta, confidence, unsampled)
        r = k_in + k_out
        wrong = round(expected_wrong_guesses(m, k_in, k_out, unsampled))
        if epsilon_lower_bound(m, r, max(r - wrong - TOLERATED_WRONG_GUESSES, 0), delta,
                               confidence) > claimed_epsilon:
            return m
    return CANARY_LADDER[-1]
