"""Calibrate the noise multiplier to a target epsilon, in bounded time, or refuse.

Epsilon decreases in sigma and is close to a straight line in (log sigma, log epsilon) (about
slope -1 for large sigma, -2 for small), so a bracket is found by jumping along that line and
then narrowed by regula falsi with the Illinois modification (Dowell, Jarratt 1971) in log
coordinates; a handful of accountant calls suffice. The bracket keeps an upper end whose
epsilon, computed by the same accountant that will report the run, is at most the target:
that end is what is returned, so the reported epsilon never exceeds the target.

Only sigma in [NOISE_MULTIPLIER_MIN, NOISE_MULTIPLIER_MAX] is searched. A target the smallest
sigma already meets (e.g. 1e300), or one the largest sigma cannot meet, is refused with a
one-line error naming ``privacy.target_epsilon`` after at most one accountant call at that end.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable

from dpbench.errors import ConfigError
from dpbench.privacy.accountant import (
    NOISE_MULTIPLIER_MAX,
    NOISE_MULTIPLIER_MIN,
    check_accountant,
    epsilon,
)
from dpbench.privacy.samplers import Sampling, sampling_epsilon

log = logging.getLogger(__name__)

#: calibration stops once the returned sigma spends at least (1 - this) * target
RELATIVE_TOLERANCE = 0.005
#: or once the bracket on sigma is this narrow (relative)
SIGMA_TOLERANCE = 1e-5
MAX_CALLS = 40


def _first_guess(target_epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """Return q sqrt(2 K log(1/delta)) / epsilon, the Gaussian-composition scale of sigma."""
    guess = sample_rate * math.sqrt(2 * steps * math.log(1 / delta)) / target_epsilon
    return min(max(guess, NOISE_MULTIPLIER_MIN), NOISE_MULTIPLIER_MAX)


def calibrate_noise_multiplier(
    target_epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str,
    sampling: Sampling | None = None, spend: Callable[[float], float] | None = None,
) -> tuple[float, str]:
    """Return (sigma, accountant used) so that ``steps`` steps at rate q spend <= target_epsilon.

    The spent epsilon lands within ``RELATIVE_TOLERANCE`` below the target (unless the
    accountant's discretisation steps over it). PLD is calibrated first and its sigma seeds
    the search of the other accountants; where PRV cannot serve (its grid would be too large)
    the PLD sigma is returned with "pld" (logged).
    Raises ConfigError naming ``privacy.target_epsilon`` when no sigma in the searched range
    meets the target, or the smallest already does.

    ``sampling``: a sampler other than Poisson (``samplers.py``) is calibrated directly with
    the accountant that will report it, on its own events.

    ``spend(sigma) -> epsilon``: a mechanism whose epsilon is not the Poisson-subsampled
    Gaussian's at (q, steps), e.g. user-level ELS (``user_level.py``), calibrated directly
    on it (``accountant`` names what reports it).
    """
    check_accountant(accountant)
    if not (0 < target_epsilon < math.inf and 0 < delta < 1 and 0 < sample_rate <= 1
            and steps >= 1):
        raise ConfigError(f"privacy.target_epsilon={target_epsilon} cannot be calibrated "
                          f"(delta={delta}, q={sample_rate}, steps={steps})")
    args = (target_epsilon, delta, sample_rate, steps)
    if spend is not None:
        return _calibrate(*args, accountant, None, spend), accountant
    if sampling is not None and not sampling.plain:
        def spend(sigma: float) -> float:
            return sampling_epsilon(sampling, accountant, [(sigma, sample_rate, steps)], delta,
                                    epsilon)
        return _calibrate(*args, accountant, None, spend), accountant
    # PLD first: it is the cheapest, and the others land close to its sigma (a good guess)
    sigma_pld, refused = None, None
    try:
        sigma_pld = _calibrate(*args, "pld", None)
    except ConfigError as err:
        if accountant == "pld":
            raise
        refused = err
    if accountant == "pld":
        return sigma_pld, "pld"
    try:
        return _calibrate(*args, accountant, sigma_pld), accountant
    except ConfigError:
        raise
    except Exception as err:  # PRV: its grid for this sigma is too large, or it failed
        if accountant != "prv":
            raise
        if sigma_pld is None:
            raise refused from err
        log.warning("PRV calibration failed (%s); calibrated with the PLD accountant", err)
        return sigma_pld, "pld"


def _calibrate(target: float, delta: float, q: float, steps: int, accountant: str,
               guess: float | None, spend: Callable[[float], float] | None = None) -> float:
    """Return the bracket's upper end once it spends within tolerance of the target.

    ``spend(sigma)``: the epsilon of the run at ``sigma`` (default: ``steps`` Poisson steps
    at rate q by ``accountant``)."""
    calls = 0

    def spent(sigma: float) -> float:
        nonlocal calls
        calls += 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if spend is not None:
                return spend(sigma)
            return epsilon(accountant, [(sigma, q, steps)], delta)

    where = f"at q={q:.4g}, {steps} steps, delta={delta:.3g} ({accountant} accountant)"
    other = "" if accountant == "pld" else ", or use privacy.accountant=pld"
    sigma = guess if guess is not None else _first_guess(target, delta, q, steps)
    eps = spent(sigma)
    lo = hi = None  # lo: spends more than the target; hi: spends at most the target
    jump = 1.1  # the least factor a bracketing jump moves sigma by; squared after each jump
    while True:
        if eps > target:
            lo = (sigma, eps)
            if sigma >= NOISE_MULTIPLIER_MAX:
                raise ConfigError(
                    f"privacy.target_epsilon={target:g} is below what the largest noise "
                    f"multiplier calibrated ({NOISE_MULTIPLIER_MAX:g}) spends, {eps:.4g} {where}; "
                    f"raise the target or train fewer steps{other}")
            factor = 1.05 * eps / target if math.isfinite(eps) else 10.0
            sigma = min(sigma * min(max(factor, jump), 1e3), NOISE_MULTIPLIER_MAX)
        else:
            hi = (sigma, eps)
            if sigma <= NOISE_MULTIPLIER_MIN:
                raise ConfigError(
                    f"privacy.target_epsilon={target:g} is above what the smallest noise "
                    f"multiplier calibrated ({NOISE_MULTIPLIER_MIN:g}) spends, {eps:.4g} {where}; "
                    f"lower the target or set privacy.noise_multiplier{other}")
            factor = 1.05 * target / max(eps, 1e-300)
            sigma = max(sigma / min(max(factor, jump), 1e3), NOISE_MULTIPLIER_MIN)
        if lo is not None and hi is not None:
            break
        jump *= jump
        eps = spent(sigma)
    # regula falsi with the Illinois rule on (log sigma, log epsilon - log target)
    side = 0
    f_lo = math.log(lo[1] / target) if math.isfinite(lo[1]) else None
    f_hi = math.log(max(hi[1], 1e-300) / target)
    while hi[1] < (1 - RELATIVE_TOLERANCE) * target and hi[0] > lo[0] * (1 + SIGMA_TOLERANCE) \
            and calls < MAX_CALLS:
        x_lo, x_hi = math.log(lo[0]), math.log(hi[0])
        if f_lo is None or f_lo - f_hi <= 0:
            x = 0.5 * (x_lo + x_hi)
        else:
            x = x_hi - f_hi * (x_hi - x_lo) / (f_hi - f_lo)
            x = min(max(x, x_lo + 0.01 * (x_hi - x_lo)), x_hi - 0.01 * (x_hi - x_lo))
        sigma = math.exp(x)
        eps = spent(sigma)
        f = math.log(eps / target) if math.isfinite(eps) and eps > 0 else None
        if eps > target:
            lo, f_lo = (sigma, eps), f
            if side == -1 and f_hi is not None:
                f_hi /= 2
            side = -1
        else:
            hi, f_hi = (sigma, eps), (f if f is not None else -50.0)
            if side == 1 and f_lo is not None:
                f_lo /= 2
            side = 1
    log.debug("calibrated sigma=%.6g (epsilon %.6g) in %d accountant calls", hi[0], hi[1], calls)
    return hi[0]
