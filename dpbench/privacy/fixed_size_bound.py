"""A lower bound on the epsilon of DP-SGD on fixed-size batches (sampling without replacement).

A constructive pair of neighbouring data sets under replace-one: one-dimensional gradients,
every other example's gradient -C, the differing example's +C in one data set and -C in the
other. A step draws B of the N examples uniformly without replacement, so the differing
example is in the batch with probability q = B / N, independently from step to step (each
step draws afresh). On the data set with -C every batch sum is -B C; on the other it is
-B C + 2C when the example is drawn. Centred and in units of the noise's 2C-relative scale
s = sigma / 2, one step's release is therefore

    P = (1 - q) N(0, s^2) + q N(1, s^2)   against   Q = N(0, s^2),

the Poisson-subsampled Gaussian pair (and its reverse, swapping the two data sets), composed
over the run's independent steps; an adaptive run includes this non-adaptive one. The
epsilon at delta of that composition, read off dp-accounting's PLD built with
``pessimistic_estimate=False`` (privacy buckets rounded optimistically, so it never overstates
the pair's divergence), is a lower bound on the epsilon of any accounting valid for the
fixed-size run: its valid (RDP) epsilon lies between the two (docs/sampling.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence


def fixed_size_lower_bound(history: Sequence[tuple[float, float, int]], sensitivity: float,
                           delta: float, discretization: float = 1e-3) -> float:
    """Return a lower bound on epsilon at ``delta`` of ``history`` (sigma, q, steps) run on
    fixed-size batches, sigma relative to C and ``sensitivity`` the relation's shift in units
    of C (2 under replace-one); see the module docstring."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    composed = None
    for sigma, q, steps in history:
        if steps <= 0:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            part = pld.from_gaussian_mechanism(
                float(sigma) / float(sensitivity), sampling_prob=float(q),
                pessimistic_estimate=False, use_connect_dots=False,
                value_discretization_interval=discretization).self_compose(int(steps))
        composed = part if composed is None else composed.compose(part)
    if composed is None:
        return 0.0
    return max(float(composed.get_epsilon_for_delta(delta)), 0.0)
