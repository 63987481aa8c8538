"""A lower bound on the epsilon of shuffled DP-SGD (Chua et al., ICML 2024).

Chua, Ghazi, Kamath, Kumar, Manurangsi, Sinha, Zhang, "How Private are DP-SGD
Implementations?" (ICML 2024), Sec. 4: for adaptive batch linear queries over a shuffled
epoch of T batches with Gaussian noise of multiplier s, take one-dimensional gradients, every
other example's gradient fixed, and the differing example moving its batch's sum by the full
sensitivity. Its batch is uniform among the T, so the epoch's released sums (centred, in units
of the noise scale's sensitivity) are

    P = (1/T) sum_t N(e_t, s^2 I_T)   against   Q = N(0, s^2 I_T).

Any post-processing of the release lower-bounds the divergence between the two; as in the
paper we keep the epoch's largest coordinate, M = max_t y_t, whose distribution is, with
Phi the standard normal CDF,

    P(M <= c) = Phi((c - 1)/s) Phi(c/s)^(T-1),    Q(M <= c) = Phi(c/s)^T.

Here M is binned on a fixed grid (post-processing again, so the bin masses are an exact pair
of distributions of a post-processed release), the E epochs' pairs composed (their
permutations are independent), and epsilon at delta read off dp-accounting's PLD built with
``pessimistic_estimate=False``: the optimistic rounding of dp-accounting never overstates the
pair's hockey-stick divergence, so the result is a lower bound on the epsilon of any
accountant valid for the shuffled mechanism.

Under replace-one, the other examples' gradients set to -C and the differing one -C against
+C give the same pair with the sum moved by 2C, i.e. s = sigma / 2; under zero-out (the
differing example's gradient +C against 0) the sum moves by C, s = sigma
(``samplers.SENSITIVITY``).

When B does not divide N the sampler leaves the last N - T B examples of each permutation out
of the epoch: the differing example is in none of the T batches with probability
w = (N - T B) / N, and then the epoch's release has Q's distribution. The epoch's pair is
therefore ((1 - w) P + w Q, Q), the mixture taken bin by bin (``left_out_fraction``).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

#: bins of the epoch's maximum, over [-BIN_SPAN s, 1 + BIN_SPAN s] plus the two tails
BINS = 4000
BIN_SPAN = 12.0


def _log_bin_masses(s: float, steps: int, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return log P and log Q of M in each bin between ``edges`` (with the two tails)."""
    from scipy.special import log_ndtr

    def log_cdf(c: np.ndarray, shift: float) -> np.ndarray:
        return log_ndtr((c - shift) / s) + (steps - 1) * log_ndtr(c / s)

    out = []
    for shift in (1.0, 0.0):
        lc = np.concatenate(([-np.inf], log_cdf(edges, shift), [0.0]))
        hi, lo = lc[1:], lc[:-1]
        # log(F(hi) - F(lo)), evaluated as 1 - F when F is near 1 (log1p(-exp)) for accuracy
        with np.errstate(divide="ignore", invalid="ignore"):
            surv_lo = np.log(-np.expm1(lo))  # log(1 - F(lo))
            surv_hi = np.where(hi == 0.0, -np.inf, np.log(-np.expm1(hi)))
            near_one = lo > math.log(0.5)
            by_cdf = hi + np.log(-np.expm1(lo - hi))
            by_surv = surv_lo + np.log(-np.expm1(surv_hi - surv_lo))
        out.append(np.where(near_one, by_surv, by_cdf))
    return out[0], out[1]


def left_out_fraction(dataset_size: int, batch_size: int, steps_per_epoch: int) -> float:
    """Return w = (N - T B) / N, the chance that an example sits a shuffled epoch out."""
    n = int(dataset_size)
    return max(n - int(steps_per_epoch) * int(batch_size), 0) / n


def shuffle_lower_bound(noise_multiplier: float, steps_per_epoch: int, epochs: int,
                        delta: float, discretization: float = 1e-3,
                        left_out: float = 0.0) -> float:
    """Return a lower bound on epsilon at ``delta`` of ``epochs`` shuffled epochs of
    ``steps_per_epoch`` batches, the Gaussian noise ``noise_multiplier`` times the
    sensitivity (Chua et al. 2024, Sec. 4; see the module docstring). ``left_out``: the
    fraction w of examples each epoch leaves out (``left_out_fraction``); the epoch's pair
    is ((1 - w) P + w Q, Q)."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    s, t, w = float(noise_multiplier), int(steps_per_epoch), float(left_out)
    if epochs <= 0 or w >= 1.0:
        return 0.0
    if not 0.0 <= w < 1.0:
        raise ValueError(f"left_out must be in [0, 1) (got {w!r})")
    edges = np.linspace(-BIN_SPAN * s, 1.0 + BIN_SPAN * s + s * math.sqrt(2 * math.log(t + 1)),
                        BINS)
    log_p, log_q = _log_bin_masses(s, t, edges)
    if w > 0.0:
        log_p = np.logaddexp(math.log1p(-w) + log_p, math.log(w) + log_q)
    keep = np.isfinite(log_p) & np.isfinite(log_q)
    upper = {i: float(v) for i, v in enumerate(log_p) if keep[i]}
    lower = {i: float(v) for i, v in enumerate(log_q) if keep[i]}
    with warnings.catch_warnings():  # dp-accounting's log-sum-exp over far tails overflows
        warnings.simplefilter("ignore", RuntimeWarning)
        one = pld.from_two_probability_mass_functions(
            lower, upper, pessimistic_estimate=False,
            value_discretization_interval=discretization, symmetric=False)
        composed = one.self_compose(int(epochs)) if epochs > 1 else one
        return max(float(composed.get_epsilon_for_delta(delta)), 0.0)
