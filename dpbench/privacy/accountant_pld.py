"""Epsilon of Poisson-subsampled Gaussian steps by dp-accounting's PLD, bounded and cached.

The numerics are dp-accounting's privacy loss distributions (Koskela, Jaelkoe, Honkela 2020;
Doroshenko, Ghazi, Kamath, Kumar, Manurangsi 2022, "Connect the dots"). This module only
chooses the discretisation, checks the grid sizes before anything is allocated, and caches.

Why the result is an upper bound at any discretisation: the pessimistic connect-the-dots PLD
of one step dominates the step's true PLD (Doroshenko et al. 2022, Sec. 3), composition of
dominating PLDs dominates the composition, tail mass cut by truncation is moved to +infinity,
and rounding a noise multiplier down (more privacy loss) never lowers epsilon. A coarser
interval is only looser, so grid sizes can be capped without giving up the bound.

Cost: a run's steps are grouped by (sigma, q); each group is one FFT self-composition
(``self_compose``), so k steps cost O(n log n) in the grid size n, not O(k). Base PLDs and
epsilons are memoised (pure functions of their arguments), so calibration and the per-epoch
queries of a run share work.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

#: (noise multiplier, sample rate, steps) of identical Poisson-subsampled Gaussian steps
Group = tuple[float, float, int]

#: grid points of one step's PLD (per adjacency direction): dp-accounting builds it with a
#: Python loop (about 15 us a point), so this caps one build near half a second
BASE_POINTS_CAP = 2**14
#: grid points of the composed PLD: caps the FFTs and dp-accounting's Python loop that
#: reads epsilon off the composed PLD
COMPOSED_POINTS_CAP = 2**19
#: distinct (sigma, q) groups composed exactly; beyond this sigma is rounded down on a
#: coarser grid (pessimistic) so one query builds at most this many base PLDs
MAX_GROUPS = 16
#: the epsilon error of connect-the-dots grows like K * interval^2 (measured about
#: 0.6 K d^2 for DP-SGD settings); interval = this / sqrt(K) keeps it near 1.5e-3
INTERVAL_SCALE = 0.05
#: and never coarser than this by default (short runs)
MAX_INTERVAL = 2e-3
#: an epsilon spanning fewer grid intervals than this is recomputed on a finer grid, so
#: small epsilons are resolved to about 0.5 %
RESOLUTION = 500
#: truncation of the composed tails (moved to +infinity: pessimistic)
TAIL_MASS = 1e-15
#: discretisation intervals used: a 1-2-5 ladder, so that queries at nearby step counts and
#: calibration share base PLDs
LADDER = tuple(m * 10.0**e for e in range(-6, 8) for m in (1.0, 2.0, 5.0))


def _ladder_at_most(x: float) -> float:
    return max([v for v in LADDER if v <= x], default=LADDER[0])


def _ladder_at_least(x: float) -> float:
    return min([v for v in LADDER if v >= x], default=LADDER[-1])


def round_down(x: float, bits: int = 36) -> float:
    """Return x rounded down to ``bits`` significant bits (cache keys; pessimistic for sigma)."""
    if x <= 0 or not math.isfinite(x):
        return x
    mantissa, exponent = math.frexp(x)
    return math.ldexp(math.floor(mantissa * 2**bits) / 2**bits, exponent)


def round_up(x: float, bits: int = 36) -> float:
    """Return x rounded up to ``bits`` significant bits (pessimistic for a sample rate)."""
    if x <= 0 or not math.isfinite(x):
        return x
    mantissa, exponent = math.frexp(x)
    return math.ldexp(math.ceil(mantissa * 2**bits) / 2**bits, exponent)


def canonical_groups(history: Iterable[Group], bits: int = 36) -> tuple[Group, ...]:
    """Return the steps merged by (sigma rounded down, q rounded up), sorted; composition
    commutes, so the order of the steps does not matter. Steps that release nothing
    (q = 0, or sigma = inf) are dropped."""
    merged: dict[tuple[float, float], int] = {}
    for sigma, q, steps in history:
        if steps <= 0 or q <= 0 or math.isinf(sigma):
            continue
        key = (round_down(float(sigma), bits), min(round_up(float(q), bits), 1.0))
        merged[key] = merged.get(key, 0) + int(steps)
    groups = tuple(sorted((s, q, k) for (s, q), k in merged.items()))
    if len(groups) <= MAX_GROUPS:
        return groups
    if bits > 4:
        return canonical_groups(groups, bits - 8)
    # still too many: MAX_GROUPS runs of consecutive sigmas, each at its smallest sigma and
    # largest q (both only increase epsilon)
    size = math.ceil(len(groups) / MAX_GROUPS)
    chunks = [groups[i:i + size] for i in range(0, len(groups), size)]
    return canonical_groups([(min(s for s, _, _ in c), max(q for _, q, _ in c),
                              sum(k for _, _, k in c)) for c in chunks], bits)


def interval_for(total_steps: int) -> float:
    """Return the default discretisation interval for a composition of ``total_steps``."""
    return _ladder_at_most(min(INTERVAL_SCALE / math.sqrt(max(total_steps, 1)), MAX_INTERVAL))


def _adjacencies(replace: bool) -> tuple[Any, ...]:
    """Return the adjacency directions of one step: remove and add (add/remove, zero-out), or
    dp-accounting's one symmetric ``REPLACE`` (replace-one: it doubles the sensitivity)."""
    from dp_accounting.pld.privacy_loss_mechanism import AdjacencyType

    return (AdjacencyType.REPLACE,) if replace else (AdjacencyType.REMOVE, AdjacencyType.ADD)


@functools.lru_cache(maxsize=256)
def _loss_span(sigma: float, q: float, replace: bool = False) -> float:
    """Return the width of one step's privacy-loss support that connect-the-dots grids."""
    from dp_accounting.pld import privacy_loss_mechanism as plm

    span = 0.0
    for adjacency in _adjacencies(replace):
        bounds = plm.GaussianPrivacyLoss(sigma, sampling_prob=q,
                                         adjacency_type=adjacency).connect_dots_bounds()
        span = max(span, bounds.epsilon_upper - bounds.epsilon_lower)
    return span


def _step_pmf(sigma: float, q: float, interval: float, adjacency: Any) -> Any:
    """Return one step's pessimistic connect-the-dots PMF in one adjacency direction, dense.

    Built from dp-accounting's public pieces the way its ``from_gaussian_mechanism`` builds
    it: the connect-the-dots bounds of the Gaussian privacy loss, rounded outward onto the
    grid; the hockey-stick divergence at each grid epsilon; the fixed-gap PMF through them.
    Dense: a sparse (small) PMF's ``self_compose`` first evaluates size**steps as a Python
    integer, seconds for a million steps; the dense FFT path is sized by Chernoff bounds.
    """
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld import privacy_loss_mechanism as plm

    loss = plm.GaussianPrivacyLoss(sigma, sensitivity=1.0, pessimistic_estimate=True,
                                   sampling_prob=q, adjacency_type=adjacency)
    bounds = loss.connect_dots_bounds()
    lower = math.floor(bounds.epsilon_lower / interval)
    upper = math.ceil(bounds.epsilon_upper / interval)
    deltas = loss.get_delta_for_epsilon(np.arange(lower, upper + 1) * interval)
    return pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(
        interval, lower, upper, deltas).to_dense_pmf()


@functools.lru_cache(maxsize=32)
def base_pmfs(sigma: float, q: float, interval: float, replace: bool = False
              ) -> tuple[Any, Any]:
    """Return one step's dense PMFs (remove, add; at q = 1 they are one and the same), as
    dp-accounting's pessimistic connect-the-dots PLD of the step has them (memoised).
    ``replace``: the step under replace-one, dp-accounting's one symmetric ``REPLACE`` PMF
    (``from_gaussian_mechanism(..., neighboring_relation=REPLACE_ONE)``), twice."""
    from dp_accounting.pld.privacy_loss_mechanism import AdjacencyType

    if replace:
        one = _step_pmf(sigma, q, interval, AdjacencyType.REPLACE)
        return one, one
    remove = _step_pmf(sigma, q, interval, AdjacencyType.REMOVE)
    if q >= 1.0:
        return remove, remove
    return remove, _step_pmf(sigma, q, interval, AdjacencyType.ADD)


def base_pld(sigma: float, q: float, interval: float, replace: bool = False) -> Any:
    """Return dp-accounting's pessimistic connect-the-dots PLD of one step."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    remove, add = base_pmfs(sigma, q, interval, replace)
    return pld.PrivacyLossDistribution(remove) if (q >= 1.0 or replace) else (
        pld.PrivacyLossDistribution(remove, add))


def dense_probabilities(pmf: Any) -> np.ndarray:
    """Return the probabilities on a dense PMF's grid.

    dp-accounting (0.6) has no public accessor for them; this is the one place dpbench reads
    a private attribute of it (``DensePLDPmf._probs``).
    """
    return pmf._probs


@functools.lru_cache(maxsize=64)
def _log_mgfs(sigma: float, q: float, interval: float, replace: bool = False
              ) -> tuple[tuple[int, Any, Any], ...]:
    """Return, per direction, (grid length, orders, log moment generating function at them)
    of one step's PLD: the inputs of dp-accounting's Chernoff bound on a self-composition's
    support (``common.compute_self_convolve_bounds``), computed once per base PLD."""
    from scipy import special

    out = []
    for pmf in base_pmfs(sigma, q, interval, replace):
        probs = dense_probabilities(pmf)
        n = len(probs)
        orders = np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / n  # as dp-accounting
        log_mgfs = np.array([special.logsumexp(np.arange(n) * o, b=probs) for o in orders])
        out.append((n, orders, log_mgfs))
    return tuple(out)


def composed_points(sigma: float, q: float, interval: float, steps: int,
                    replace: bool = False) -> int:
    """Return the grid length ``base_pld(...).self_compose(steps)`` allocates: the untruncated
    length, or the Chernoff bounds dp-accounting truncates to (same formula, cached MGFs)."""
    points = 0
    for n, orders, log_mgfs in _log_mgfs(sigma, q, interval, replace):
        lower, upper = 0, steps * (n - 1)
        if upper + 1 > COMPOSED_POINTS_CAP:
            with np.errstate(all="ignore"):
                bounds = (steps * log_mgfs + math.log(2 / TAIL_MASS)) / orders
            finite = np.isfinite(bounds)
            if (finite & (orders > 0)).any():
                upper = min(upper, math.ceil(bounds[finite & (orders > 0)].min()))
            if (finite & (orders < 0)).any():
                lower = max(lower, math.floor(bounds[finite & (orders < 0)].max()))
        points = max(points, upper - lower + 1, n)
    return points


def plan_interval(groups: tuple[Group, ...], finest: float = math.inf,
                  replace: bool = False) -> float:
    """Return the interval to compose ``groups`` at: the default for their total step count
    (or ``finest`` if smaller), coarsened until one step's grid fits ``BASE_POINTS_CAP``
    and the composed grid fits ``COMPOSED_POINTS_CAP``. The first check allocates nothing;
    the second sizes the composition from the (capped) base PLDs before any FFT runs."""
    total = sum(k for _, _, k in groups)
    interval = min(interval_for(total), _ladder_at_most(finest))
    widest = max(_loss_span(s, q, replace) for s, q, _ in groups)
    interval = max(interval, _ladder_at_least(widest / BASE_POINTS_CAP))
    for _ in range(len(LADDER)):
        points = sum(composed_points(s, q, interval, k, replace) for s, q, k in groups)
        if points <= COMPOSED_POINTS_CAP or interval >= LADDER[-1]:
            break
        interval = _ladder_at_least(interval * 1.01 * points / COMPOSED_POINTS_CAP)
    return interval


def composed_epsilon(parts: Iterable[tuple[Any, int]], delta: float) -> float:
    """Return epsilon at ``delta`` of each (one step's PLD, steps) self-composed and all
    composed, tails beyond ``TAIL_MASS`` moved to +infinity (pessimistic), at least 0."""
    composed = None
    for base, steps in parts:
        part = base.self_compose(steps, tail_mass_truncation=TAIL_MASS)
        composed = part if composed is None else composed.compose(part, TAIL_MASS)
    return max(float(composed.get_epsilon_for_delta(delta)), 0.0)


def _compose(groups: tuple[Group, ...], interval: float, delta: float,
             replace: bool = False) -> float:
    return composed_epsilon(((base_pld(sigma, q, interval, replace), steps)
                             for sigma, q, steps in groups), delta)


@functools.lru_cache(maxsize=4096)
def pld_epsilon(groups: tuple[Group, ...], delta: float, replace: bool = False) -> float:
    """Return an upper bound on epsilon at ``delta`` of the composition of ``groups``.

    ``groups`` must come from ``canonical_groups`` (sorted, merged, hashable). A small
    epsilon (below ``RESOLUTION`` intervals) is recomputed once on a finer grid, and the
    smaller of the two upper bounds is returned. ``replace``: under replace-one, each
    multiplier relative to C (dp-accounting's ``REPLACE`` doubles the sensitivity); else
    under add/remove (or zero-out, the same privacy loss), relative to the shift.
    """
    if not groups:
        return 0.0
    if any(s <= 0 for s, _, _ in groups):
        return math.inf
    interval = plan_interval(groups, replace=replace)
    eps = _compose(groups, interval, delta, replace)
    if math.isfinite(eps) and eps < RESOLUTION * interval:
        finer = plan_interval(groups, finest=max(eps, LADDER[0]) / RESOLUTION, replace=replace)
        if finer < interval:
            eps = min(eps, _compose(groups, finer, delta, replace))
    return eps


def cache_counts() -> dict[str, int]:
    """Return how many base PLDs were built and compositions run (for tests and benchmarks)."""
    return {"base_builds": base_pmfs.cache_info().misses,
            "compositions": pld_epsilon.cache_info().misses}
