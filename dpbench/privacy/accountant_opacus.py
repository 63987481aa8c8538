"""Opacus's RDP and PRV accountants over grouped steps, cached and with PRV's grid checked first.

RDP (Mironov 2017; Mironov, Talwar, Zhang 2019): the Renyi divergences of one step at each
order add up over steps, so each distinct (sigma, q) is analysed once (``compute_rdp``) and
a run of k steps is k times that vector; the conversion to (epsilon, delta) is Balle et al.
2020, Thm. 21 (``get_privacy_spent``). RDP is an upper bound, looser than PLD or PRV.

PRV (Gopi, Lee, Wutschitz 2021): Opacus sizes its grid from an RDP tail bound L and a mesh
eps_error / sqrt(K log(12 / delta_error) / 2) (``PRVAccountant._get_domain``). For a small
sigma that grid runs to billions of points, so its size is computed first, with Opacus's own
formula, and a grid over ``PRV_POINTS_CAP`` raises ``GridTooLarge`` before anything is
allocated.
"""

from __future__ import annotations

import functools
import math
import warnings

from dpbench.privacy.accountant_pld import Group

#: PRV grid points allowed (a few float64 arrays of this length; about 1 GB peak, 5 s)
PRV_POINTS_CAP = 2**20
#: Opacus's defaults for ``PRVAccountant.get_epsilon``
PRV_EPS_ERROR = 0.01


class GridTooLarge(ValueError):
    """An accountant would need more grid points than its cap (raised before allocating)."""


def _orders() -> list[float]:
    from opacus.accountants import RDPAccountant

    return list(RDPAccountant.DEFAULT_ALPHAS)


@functools.lru_cache(maxsize=256)
def _rdp_one_step(sigma: float, q: float) -> tuple[float, ...]:
    """Return one step's Renyi divergences at Opacus's default orders (memoised)."""
    from opacus.accountants.analysis import rdp as analysis

    return tuple(float(r) for r in analysis.compute_rdp(
        q=q, noise_multiplier=sigma, steps=1, orders=_orders()))


@functools.lru_cache(maxsize=4096)
def rdp_epsilon(groups: tuple[Group, ...], delta: float) -> float:
    """Return the RDP accountant's epsilon at ``delta`` of ``groups`` (canonical, hashable)."""
    from opacus.accountants.analysis import rdp as analysis

    if not groups:
        return 0.0
    if any(s <= 0 for s, _, _ in groups):
        return math.inf
    orders = _orders()
    total = [0.0] * len(orders)
    for sigma, q, steps in groups:
        total = [t + steps * r for t, r in zip(total, _rdp_one_step(sigma, q))]
    eps, _ = analysis.get_privacy_spent(orders=orders, rdp=total, delta=delta)
    return float(eps)


def prv_grid_points(groups: tuple[Group, ...], delta: float) -> float:
    """Return the grid length Opacus's PRV accountant would allocate for ``groups``."""
    from opacus.accountants.analysis.prv import (
        PoissonSubsampledGaussianPRV,
        compute_safe_domain_size,
    )

    delta_error = delta / 1000  # Opacus's default
    steps = [k for _, _, k in groups]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        half_width = compute_safe_domain_size(
            prvs=[PoissonSubsampledGaussianPRV(q, s) for s, q, _ in groups],
            max_self_compositions=steps, eps_error=PRV_EPS_ERROR, delta_error=delta_error)
    mesh = PRV_EPS_ERROR / math.sqrt(sum(steps) * math.log(12 / delta_error) / 2)
    return 2 * half_width / mesh


@functools.lru_cache(maxsize=1024)
def prv_epsilon(groups: tuple[Group, ...], delta: float) -> float:
    """Return Opacus's PRV epsilon at ``delta``; raise GridTooLarge past ``PRV_POINTS_CAP``."""
    from opacus.accountants import PRVAccountant

    if not groups:
        return 0.0
    if any(s <= 0 for s, _, _ in groups):
        return math.inf
    points = prv_grid_points(groups, delta)
    if not points <= PRV_POINTS_CAP:
        raise GridTooLarge(f"the PRV accountant would need {points:.3g} grid points "
                           f"(limit {PRV_POINTS_CAP})")
    accountant = PRVAccountant()
    accountant.history = [(s, q, k) for s, q, k in groups]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(accountant.get_epsilon(delta=delta, eps_error=PRV_EPS_ERROR))
