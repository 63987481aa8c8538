"""The claims' planned two-stage design (docs/tuning-and-claims.md, "The design").

A paper's claims are decided in at most two looks, declared before the first:

- **Stage 1, the pilot** (``PILOT_SEEDS`` seeds a cell by default): every elementary one-sided
  test (a claim's cell, a null value, a direction) gives its p-value q1 on the pilot's seeds,
  and may decide at the level ``PILOT_SHARE`` x alpha.
- **Stage 2, the follow-up**, sized from the pilot by the hint (``follow_up_seeds``): only
  the new seeds give q2, and the stages are combined by the inverse-normal combination test
  (Bauer & Koehne 1994; Lehmacher & Wassmer 1999, eq. 2), with weights fixed in advance
  (``STAGE1_WEIGHT``):

      z = w1 Phi^-1(1 - q1) + w2 Phi^-1(1 - q2),   w1^2 + w2^2 = 1,   qc = 1 - Phi(z),

  which is uniform under H0 whatever rule chose the follow-up's size from stage 1 (q2 is
  independent of stage 1 given its size). It may decide at (1 - PILOT_SHARE) x alpha.

The design's one-sided p-value is ``min(q1 / PILOT_SHARE, qc / (1 - PILOT_SHARE))``: by
Bonferroni over the two looks, P(it is <= a) <= a under H0 at every level a, so it enters
Holm within a paper like any p-value, and a pilot that decided stands (the minimum only falls).
Futility stopping is non-binding: a claim whose follow-up is out of reach is not followed up,
which cannot raise an error rate.

The hint is an assurance (O'Hagan, Stevens & Campbell 2005): the power of the follow-up's
test averaged over what the pilot says about each cell's standard deviation (sigma^2 ~
(n - 1) s^2 / chi^2_{n - 1}, the posterior under the reference prior), rather than the power
at one upper bound on it. A claim of several cells shares one follow-up size, sized at the
nominal assurance that delivers the target power at the pilot's spreads shrunk toward their
common level (``calibrated_assurance``: Beran's 1987 prepivoting at an empirical-Bayes
plug-in), and a paper with such a claim gets a pilot of ``PILOT_SEEDS_CELLS`` seeds
(``pilot_seeds``): at 5 the pilot cannot tell equal SDs from one dominant SD well enough for
any one size to deliver 0.80 +- 0.03 at both (measured: docs/tuning-and-claims.md, "Seeds
needed").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import integrate, special, stats
from scipy.stats import qmc

from dpbench.analysis.stats import ALPHA, POWER, SKEW_SHIFT_MIN_N, hall_critical

#: the seeds a cell gets in the pilot (stage 1) of ``dpbench-reproduce --until-decided``
PILOT_SEEDS = 5
#: the seeds a cell of the pilot of a paper with a one-sided claim of several cells
#: (``pilot_seeds``): the every-cell hint's calibration reads the pattern of the cells' SDs
#: off the pilot, whose log-SD scatters by sqrt(psi'(df / 2)) / 2 a cell (0.40 at 5 seeds,
#: 0.25 at 10); with 5 its delivered power ranges 0.70-0.87 across SD patterns, with 10
#: 0.77-0.83 (docs/tuning-and-claims.md, "Seeds needed")
PILOT_SEEDS_CELLS = 10
#: the inverse-normal weight of stage 1, fixed before any look (w1^2 = 0.1: a pilot of 5
#: seeds against a follow-up of about 45, the hints' typical size; a mismatch costs little
#: power, and a small pilot weight keeps a 5-seed t statistic's skewed tail out of the
#: combined test: measured in docs/tuning-and-claims.md, "Operating characteristics")
STAGE1_WEIGHT = math.sqrt(0.1)
#: the share of each one-sided test's alpha the pilot may spend (the rest is the follow-up's):
#: O'Brien-Fleming-type spending (Lan & DeMets 1983, alpha_1 = 2 - 2 Phi(z_{1 - alpha/2} /
#: sqrt(t1))) at the information fraction t1 = w1^2 and alpha = 2.5 %: about 5e-11, so in
#: effect a pilot of 5 seeds decides nothing (a t test's far tail is least trustworthy there
#: under skew) and sizes the follow-up
PILOT_SHARE = float(2 * stats.norm.sf(stats.norm.isf(ALPHA / 4) / STAGE1_WEIGHT)) / (ALPHA / 2)
#: the most seeds a cell's follow-up is ever sized to
MAX_FOLLOW_UP = 1000
#: the points of the Gauss-Laguerre quadrature over the standard deviation's posterior
QUADRATURE = 24
#: the design's stage tests move the sample skewness by the full offset at every size
#: (``stats.skew_offset`` with no floor): the pilot's 5 values weigh little, so the flattened
#: transformation costs little power there, and a pilot's liberal tail under skew otherwise
#: reaches the combined test (measured: docs/tuning-and-claims.md, "Skewed gains")
STAGE_SKEW_FLOOR = 1.0


def pilot_seeds(several_cells: bool) -> int:
    """Return the design's default pilot, seeds a cell: ``PILOT_SEEDS_CELLS`` for a paper
    with a one-sided claim of several cells (``several_cells``), else ``PILOT_SEEDS``."""
    return PILOT_SEEDS_CELLS if several_cells else PILOT_SEEDS


@dataclass(frozen=True)
class Stages:
    """The seeds of each stage: ``pilot`` (stage 1) and ``follow_up`` (stage 2, empty before
    it is launched). ``None`` as a claim's design means one fixed look at the full alpha."""

    pilot: tuple[int, ...]
    follow_up: tuple[int, ...] = ()

    def stage_of(self, seed: int) -> int | None:
        """Return 1 or 2, or None for a seed outside the design."""
        if seed in self.pilot:
            return 1
        return 2 if seed in self.follow_up else None

    @property
    def seeds(self) -> tuple[int, ...]:
        return tuple(self.pilot) + tuple(self.follow_up)


def combine(q1: np.ndarray | float, q2: np.ndarray | float,
            w1: float = STAGE1_WEIGHT) -> np.ndarray:
    """Return the inverse-normal combination of two independent one-sided p-values (NaN
    where either is NaN)."""
    w2 = math.sqrt(1 - w1 ** 2)
    q1, q2 = (np.clip(np.asarray(q, dtype=float), 1e-300, 1.0) for q in (q1, q2))
    return stats.norm.sf(w1 * stats.norm.isf(q1) + w2 * stats.norm.isf(q2))


def design_p(q1: np.ndarray | float, q2: np.ndarray | float | None = None,
             share: float = PILOT_SHARE, w1: float = STAGE1_WEIGHT) -> np.ndarray:
    """Return the design's one-sided p-value: min(q1 / share, qc / (1 - share)), qc the
    combination with stage 2 (absent or NaN: the pilot's look alone). A pilot too small for
    its test (NaN: fewer values than the test needs, fixed by the design's pilot size, not by
    the data) weighs nothing: qc is stage 2's own p."""
    q1 = np.asarray(q1, dtype=float)
    out = np.minimum(1.0, q1 / share)
    if q2 is None:
        return out
    q2 = np.asarray(q2, dtype=float)
    qc = np.where(np.isnan(q1), q2, combine(q1, q2, w1)) / (1 - share)
    return np.fmin(out, np.minimum(1.0, qc))


def t_test_power(effect: float | np.ndarray, sigma: np.ndarray, n: np.ndarray,
                 level: np.ndarray | float, tost: bool = False,
                 margin: float | None = None,
                 floor: float = SKEW_SHIFT_MIN_N,
                 level_far: np.ndarray | float | None = None) -> np.ndarray:
    """Return the power of the claims' one-sided test (``stats.one_sided_q``: the t test on
    Hall's transformation, its skewness moved to the conservative side) at one-sided
    ``level`` on ``n`` values when the true mean of a symmetric gain lies ``effect`` beyond
    the null (noncentral t at the transformed critical value, ``stats.hall_critical``,
    broadcast over the arguments); with ``tost`` the exact power of TOST within +-``margin``
    (``tost_power``) at a true difference ``margin - effect`` (the near side ``effect``
    inside its margin; no ``margin``: no difference, both sides at ``effect``), the near
    side's test at ``level``, the far side's at ``level_far`` (None: ``level``)."""
    n = np.asarray(n, dtype=float)

    def critical(at: np.ndarray | float) -> np.ndarray:
        return hall_critical(stats.t.isf(np.clip(at, 1e-300, 1 - 1e-16), n - 1), n,
                             floor=floor)

    crit = critical(level)
    effect = np.asarray(effect, dtype=float)
    if tost:
        return tost_power(effect, effect if margin is None else 2 * margin - effect,
                          sigma, n, crit, crit if level_far is None else critical(level_far))
    return stats.nct.sf(crit, n - 1, effect * np.sqrt(n) / sigma)


#: Gauss-Legendre nodes of the exact TOST power's integral over the sample SD, and the
#: probability left out in each tail of the SD's distribution
TOST_NODES = 48
TOST_TAIL = 1e-12


def tost_power(near: np.ndarray | float, far: np.ndarray | float, sigma: np.ndarray | float,
               n: np.ndarray | float, crit: np.ndarray | float,
               crit_far: np.ndarray | float | None = None) -> np.ndarray:
    """Return the exact power of TOST on ``n`` normal values of SD ``sigma`` whose true mean
    lies ``near`` inside one margin and ``far`` inside the other, the near side's one-sided
    t test rejecting at t >= ``crit``, the far side's at t >= ``crit_far`` (None: ``crit``):
    both reject exactly when the mean falls in (-m + crit_far s / sqrt(n), m - crit s /
    sqrt(n)) (the near margin at +m), so with w = s / sigma ((n - 1) w^2 ~ chi^2_{n-1},
    independent of the mean; Schuirmann 1987, Owen 1965)

        power = E_w[max(0, Phi(sqrt(n) near / sigma - crit w)
                            + Phi(sqrt(n) far / sigma - crit_far w) - 1)],

    integrated over w from its 1e-12 quantile to the smaller of its 1 - 1e-12 quantile and
    w* (where the interval closes: the integrand is smooth up to there) by Gauss-Legendre
    (``scipy.integrate.fixed_quad``) against w's density (``scipy.stats.chi2``). Broadcast
    over the arguments."""
    n = np.asarray(n, dtype=float)
    df = n - 1
    a = np.sqrt(n) * np.asarray(near, dtype=float) / sigma
    b = np.sqrt(n) * np.asarray(far, dtype=float) / sigma
    crit = np.asarray(crit, dtype=float)
    crit_far = crit if crit_far is None else np.asarray(crit_far, dtype=float)
    a, b, crit, crit_far, df = np.broadcast_arrays(a, b, crit, crit_far, df)
    both = crit + crit_far
    with np.errstate(divide="ignore", invalid="ignore"):
        closes = np.where(both > 0, (a + b) / both, np.inf)
    lo = np.sqrt(stats.chi2.ppf(TOST_TAIL, df) / df)
    hi = np.minimum(closes, np.sqrt(stats.chi2.isf(TOST_TAIL, df) / df))
    width = np.maximum(hi - lo, 0.0)

    def integrand(t: np.ndarray) -> np.ndarray:
        w = lo[..., None] + width[..., None] * t
        inside = (stats.norm.cdf(a[..., None] - crit[..., None] * w)
                  + stats.norm.cdf(b[..., None] - crit_far[..., None] * w) - 1)
        density = stats.chi2.pdf(df[..., None] * w ** 2, df[..., None]) * 2 * df[..., None] * w
        return np.maximum(0.0, inside) * density

    value, _ = integrate.fixed_quad(integrand, 0.0, 1.0, n=TOST_NODES)
    return np.clip(width * value, 0.0, 1.0)


def assurance(effect: float, sds: Sequence[float], pilot_n: Sequence[int] | int,
              n: np.ndarray | int, level: Sequence[float] | float,
              tost: bool = False, margin: float | None = None) -> np.ndarray:
    """Return the assurance of every cell's test at once: the product over the cells of each
    cell's power averaged over its standard deviation's posterior, with ``n`` values a cell
    at one-sided ``level`` (one per cell, or one for all)."""
    sds = np.asarray(sds, dtype=float)[None]
    levels = np.broadcast_to(np.asarray(level, dtype=float), (sds.shape[1],))[None]
    n = np.asarray(n)
    out = _assurance_many(effect, sds, _pilot(pilot_n, sds.shape[1]),
                          n.reshape(-1, 1) if n.ndim else np.array([[int(n)]]), levels, tost,
                          margin)
    return out.reshape(n.shape) if n.ndim else out.reshape(())


def _pilot(pilot_n: Sequence[int] | int, cells: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(pilot_n, dtype=int), (cells,))


def _posterior_scale(pilot: int) -> tuple[np.ndarray, np.ndarray]:
    """Return the nodes sigma / s and weights of the posterior expectation over sigma^2 =
    (n - 1) s^2 / X, X ~ chi^2_{n-1}: generalised Gauss-Laguerre quadrature in X / 2
    (``scipy.special.roots_genlaguerre``, weight x^(df / 2 - 1) e^-x; exact for polynomials
    of degree 2 QUADRATURE - 1 in X)."""
    df = max(1, pilot - 1)
    x, w = special.roots_genlaguerre(QUADRATURE, df / 2 - 1)
    return np.sqrt(df / (2 * x)), w / w.sum()


def _assurance_many(effect: float | np.ndarray, sds: np.ndarray, pilot: np.ndarray,
                    n: np.ndarray, levels: np.ndarray, tost: bool,
                    margin: float | None = None,
                    floor: float = SKEW_SHIFT_MIN_N) -> np.ndarray:
    """Assurance for each row of ``sds`` / ``levels`` (rows x cells, or one row against every
    n) at ``n`` (rows x 1). For TOST ``levels`` may carry a last axis of two, the levels of
    the sides against the lower and the upper margin: a cell's power is then the smaller of
    the two ways the true difference may lie (either side the near one)."""
    joint = np.ones(n.shape[0])
    effect = np.asarray(effect, dtype=float).reshape(-1, 1) if np.ndim(effect) else effect
    for c in range(sds.shape[1]):
        sd = sds[:, c]
        scale, weight = _posterior_scale(int(pilot[c]))                       # K
        sigma = sd[:, None] * scale[None]                                     # rows x K
        flat = ~(sd > 1e-12 * np.abs(effect).reshape(-1))   # no spread seen: no limit on n
        sigma = np.where(flat[:, None], 1.0, sigma)
        if levels.ndim == 3:   # TOST, a level a side
            low, high = levels[:, c, 0:1], levels[:, c, 1:2]
            power = np.minimum(
                t_test_power(effect, sigma, n, low, True, margin, floor, high) @ weight,
                t_test_power(effect, sigma, n, high, True, margin, floor, low) @ weight)
        else:
            power = t_test_power(effect, sigma, n, levels[:, c:c + 1], tost, margin,
                                 floor) @ weight
        joint = joint * np.where(np.broadcast_to(flat, power.shape), 1.0, power)
    return joint


#: the calibration of an "every cell" hint: its inner pilots (an unscrambled Sobol' set, so
#: the hint is a deterministic function of the pilot), the nominal assurances it searches,
#: and the follow-up sizes (ratios to a rough size) it evaluates them at
CALIBRATION_PILOTS = 256
CALIBRATION_LEVELS = np.linspace(0.3, 0.995, 140)
CALIBRATION_SIZES = np.geomspace(1 / 64, 64, 96)
#: the points of a cell's posterior power tabulated in log(effect sqrt(n) / s)
CALIBRATION_TABLE = 801


def _calibration_draws(pilot: np.ndarray) -> np.ndarray:
    """The inner pilots' s / sigma (CALIBRATION_PILOTS x cells): chi quantiles of df = n - 1
    at the points of an unscrambled Sobol' sequence (``scipy.stats.qmc.Sobol``), shifted half
    a cell off the sequence's origin."""
    cells = len(pilot)
    u = qmc.Sobol(cells, scramble=False).random(CALIBRATION_PILOTS)   # a power of 2
    u = (u + 0.5 / CALIBRATION_PILOTS) % 1.0
    df = np.maximum(1, pilot - 1).astype(float)
    return np.sqrt(stats.chi2.ppf(u, df) / df)


def shrunk_spreads(sds: np.ndarray, pilot: np.ndarray) -> np.ndarray:
    """Return each row of the cells' pilot spreads (rows x cells, all > 0) shrunk toward
    their geometric mean on the log scale by the positive-part James-Stein factor (Efron &
    Morris 1975; Morris 1983, eq. 3.3):

        log s'_c = m + B (log s_c - m),   B = max(0, 1 - v / V),

    m the row's mean log spread, V the sample variance of the row's log spreads (ddof 1),
    v = mean_c psi'(df_c / 2) / 4 the sampling variance of log s of a normal sample of df_c =
    n_c - 1 (``scipy.special.polygamma``). Equal SDs give V near v and a pattern near equal;
    a dominant SD keeps most of its distance."""
    log_s = np.log(np.asarray(sds, dtype=float))
    mean = log_s.mean(-1, keepdims=True)
    df = np.maximum(1, np.asarray(pilot) - 1).astype(float)
    v = float(np.mean(special.polygamma(1, df / 2) / 4))
    spread = log_s.var(-1, ddof=1, keepdims=True) if log_s.shape[-1] > 1 else np.zeros_like(
        mean)
    factor = np.clip(1 - v / np.maximum(spread, 1e-300), 0.0, 1.0)
    return np.exp(mean + factor * (log_s - mean))


def calibrated_assurance(effect: np.ndarray, sds: np.ndarray, pilot: np.ndarray,
                         levels: np.ndarray, power: float = POWER) -> np.ndarray:
    """Return, for each row of pilot spreads ``sds`` (rows x cells) and one-sided
    ``levels``, the nominal assurance at which the every-cell hint delivers ``power`` were
    the cells' SDs the pilot's spreads: Beran's (1987) prepivoting, a parametric bootstrap
    calibration of the rule's nominal level.

    One follow-up size serves every cell, and the hint's assurance (the product of the cells'
    posterior assurances, ``_assurance_many``) follows the largest of the cells' spreads; it
    delivers its nominal power when one cell's SD dominates and more when the SDs are alike.
    The calibration measures that excess at the plug-in SDs s_c (the pilot's spreads
    shrunk: the raw ones always look less alike than the truth, so plugged in they
    over-deliver at equal SDs): inner pilots s*_bc = s_c
    w_bc (w_bc the chi quantiles of ``_calibration_draws``), each sized by the rule at a
    nominal assurance g, n*_b(g), and the rule's delivered power

        D(g) = (1 / B) sum_b prod_c Phi(effect sqrt(n*_b(g)) / s_c - z_c),   z_c = Phi^-1(1 -
        level_c),

    the smallest-n crossing of the inner assurance A_b(n) = prod_c E_post Phi(effect sqrt(n)
    / sigma - z_c) (the same posterior quadrature as the hint), both in the normal-theory
    (known-SD) form and with n continuous, on a grid of sizes around the rough size
    ((z + 1) max s / effect)^2, interpolated in log n. The answer solves D(g) = ``power``
    (by interpolation over ``CALIBRATION_LEVELS``; D is made non-decreasing first). For one
    cell the pivot n ~ s^2 makes D(g) = g, so the calibration changes nothing there."""
    sds = shrunk_spreads(np.asarray(sds, dtype=float), np.asarray(pilot))
    rows, cells = sds.shape
    levels = np.broadcast_to(np.asarray(levels, dtype=float), sds.shape)
    effect = np.broadcast_to(np.asarray(effect, dtype=float), (rows,))
    w = _calibration_draws(np.asarray(pilot))                                  # B x cells
    nodes = [_posterior_scale(int(p)) for p in pilot]
    scale = np.stack([s for s, _ in nodes])                                    # cells x K
    weight = np.stack([k for _, k in nodes])                                   # cells x K
    z = stats.norm.isf(np.clip(levels, 1e-300, 1 - 1e-16))                     # rows x cells
    rough = ((z.max(-1) + 1.0) * sds.max(-1) / effect) ** 2
    log_g = np.log(CALIBRATION_SIZES)
    # a cell's posterior power is a function of x = effect sqrt(n) / s alone: tabulated in
    # log x and interpolated at the inner pilots' x
    log_x = np.linspace(-8.0, 8.0, CALIBRATION_TABLE)
    x = np.exp(log_x)
    out = np.empty(rows)
    for r in range(rows):
        table = (special.ndtr(x[None, :, None] / scale[:, None] - z[r][:, None, None])
                 * weight[:, None]).sum(-1)                                    # cells x X
        root = effect[r] * np.sqrt(rough[r] * CALIBRATION_SIZES)              # J
        truth = np.log(np.maximum(special.ndtr(
            root[:, None] / sds[r] - z[r]).prod(-1), 1e-300))                  # J
        at = np.log(root[None, :, None] / (sds[r] * w)[:, None, :])            # B x J x cells
        inner = np.stack([np.interp(at[..., c], log_x, table[c]) for c in range(cells)],
                         -1).prod(-1)                                          # B x J
        inner = np.maximum.accumulate(inner, axis=-1)
        # each inner pilot's size at each nominal level: the first crossing, interpolated
        j = np.clip((inner[:, :, None] < CALIBRATION_LEVELS).sum(1), 1, len(log_g) - 1)
        a0 = np.take_along_axis(inner, j - 1, 1)
        a1 = np.take_along_axis(inner, j, 1)
        frac = np.clip((CALIBRATION_LEVELS - a0) / np.maximum(a1 - a0, 1e-300), 0.0, 1.0)
        n_b = log_g[j - 1] + frac * (log_g[j] - log_g[j - 1])                  # B x L
        delivered = np.exp(np.interp(n_b, log_g, truth)).mean(0)
        out[r] = np.interp(power, np.maximum.accumulate(delivered), CALIBRATION_LEVELS)
    return out


def seeds_for_assurance_many(effect: float | np.ndarray, sds: np.ndarray,
                             pilot_n: Sequence[int] | int,
                             levels: np.ndarray, power: float = POWER, tost: bool = False,
                             min_n: int = 2, max_n: int = MAX_FOLLOW_UP,
                             margin: float | None = None,
                             floor: float = SKEW_SHIFT_MIN_N,
                             calibrate: bool = True) -> np.ndarray:
    """Return for each row of ``sds`` and ``levels`` (rows x cells) the smallest n in [min_n,
    max_n] whose assurance reaches ``power``, -1 beyond ``max_n`` (a bisection over all rows
    at once: the assurance grows with n). A one-sided claim of several cells (``calibrate``,
    not TOST) is sized at the nominal assurance that delivers ``power`` at the pilot's
    spreads (``calibrated_assurance``)."""
    sds = np.atleast_2d(np.asarray(sds, dtype=float))
    levels = np.asarray(levels, dtype=float)
    sided = tost and levels.ndim == 3   # TOST with a level a side (rows x cells x 2)
    levels = np.broadcast_to(levels, sds.shape + ((2,) if sided else ()))
    pilot = _pilot(pilot_n, sds.shape[1])
    rows = len(sds)
    effect = np.broadcast_to(np.asarray(effect, dtype=float), (rows,))
    valid = np.isfinite(effect) & (effect > 0)
    if not valid.any():
        return np.full(rows, -1)
    finite = np.isfinite(sds).all(-1) & np.isfinite(levels).reshape(rows, -1).all(-1) & valid
    effect = np.where(valid, effect, 1.0)
    safe_sds, safe_levels = np.where(np.isfinite(sds), sds, 1.0), np.where(
        np.isfinite(levels), levels, 0.5)

    target = np.full(rows, float(power))
    spread = finite & (safe_sds > 1e-12 * np.abs(effect)[:, None]).all(-1)
    if calibrate and not tost and sds.shape[1] > 1 and spread.any():
        target[spread] = calibrated_assurance(effect[spread], safe_sds[spread], pilot,
                                              safe_levels[spread], power)

    def reaches(n: np.ndarray) -> np.ndarray:
        return _assurance_many(effect, safe_sds, pilot, n[:, None].astype(float),
                               safe_levels, tost, margin, floor) >= target

    lo = np.full(rows, max(2, min_n))
    hi = np.full(rows, max_n)
    out = np.where(reaches(hi), hi, -1)
    out = np.where(reaches(lo), lo, out)
    open_ = (out == max_n) & (lo < max_n)
    while open_.any():
        mid = (lo + hi) // 2
        ok = reaches(mid)
        hi = np.where(open_ & ok, mid, hi)
        lo = np.where(open_ & ~ok, mid, lo)
        open_ = open_ & (hi - lo > 1)
    out = np.where((out == max_n) & (lo < max_n), hi, out)
    return np.where(finite, out, -1)


def conditional_level(q1: np.ndarray | float, level: float, share: float = PILOT_SHARE,
                      w1: float = STAGE1_WEIGHT) -> np.ndarray:
    """Return the one-sided level stage 2's own p-value must reach for the combination to
    reject at the follow-up's share of ``level`` given the pilot's q1 (Proschan & Hunsberger
    1995: the conditional error); a missing q1 (NaN): the follow-up's share itself."""
    w2 = math.sqrt(1 - w1 ** 2)
    q1 = np.asarray(q1, dtype=float)
    z1 = stats.norm.isf(np.clip(q1, 1e-300, 1.0))
    need = (float(stats.norm.isf((1 - share) * level)) - w1 * z1) / w2
    return np.where(np.isnan(q1), (1 - share) * level, stats.norm.sf(need))


def follow_up_seeds_many(effect: float | np.ndarray, sds: np.ndarray, pilot_n: Sequence[int] | int,
                         q1: np.ndarray, family: int = 1, tost: bool = False,
                         power: float = POWER, max_n: int = MAX_FOLLOW_UP,
                         margin: float | None = None) -> np.ndarray:
    """Return for each row (rows x cells) the follow-up's seeds a cell at which the claim's
    test for it rejects with assurance ``power`` when the true effect lies ``effect`` beyond
    its null: each cell's stage 2 at its conditional level given the pilot's one-sided
    ``q1`` (Holm's first level, alpha / family); for TOST ``q1`` rows x cells x 2, the
    pilot's q of the sides against the lower and the upper margin, each side at its own
    conditional level; -1 out of reach. Several one-sided cells: at the calibrated nominal
    assurance (``calibrated_assurance``)."""
    level = ALPHA / 2 / max(1, family)
    return seeds_for_assurance_many(effect, sds, pilot_n, conditional_level(q1, level),
                                    power, tost, 3, max_n, margin, STAGE_SKEW_FLOOR)


def follow_up_seeds(effect: float, sds: Sequence[float], pilot_n: Sequence[int] | int,
                    q1: Sequence[float], family: int = 1, tost: bool = False,
                    power: float = POWER, max_n: int = MAX_FOLLOW_UP,
                    margin: float | None = None) -> int | None:
    """``follow_up_seeds_many`` for one claim; None out of reach."""
    n = int(follow_up_seeds_many(effect, np.asarray([sds], dtype=float), pilot_n,
                                 np.asarray([q1], dtype=float), family, tost, power,
                                 max_n, margin)[0])
    return n if n > 0 else None


def fixed_seeds_many(effect: float | np.ndarray, sds: np.ndarray,
                     pilot_n: Sequence[int] | int, family: int = 1, tost: bool = False,
                     power: float = POWER, min_n: int = 2, max_n: int = MAX_FOLLOW_UP,
                     margin: float | None = None) -> np.ndarray:
    """Return for each row of pilot spreads (rows x cells) the seeds a cell of a fresh fixed
    design (one look at the full alpha, Holm's first level) needs for assurance ``power``;
    -1 out of reach."""
    return seeds_for_assurance_many(effect, sds, pilot_n, ALPHA / 2 / max(1, family), power,
                                    tost, min_n, max_n, margin)


def fixed_seeds(effect: float, sds: Sequence[float], pilot_n: Sequence[int] | int,
                family: int = 1, tost: bool = False, power: float = POWER,
                min_n: int = 2, max_n: int = MAX_FOLLOW_UP,
                margin: float | None = None) -> int | None:
    """``fixed_seeds_many`` for one claim; None out of reach."""
    n = int(fixed_seeds_many(effect, np.asarray([sds], dtype=float), pilot_n, family, tost,
                             power, min_n, max_n, margin)[0])
    return n if n > 0 else None


def failure_interval(failed: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Return the Clopper-Pearson interval of a failure rate (``scipy.stats.binomtest``)."""
    if n <= 0:
        return math.nan, math.nan
    ci = stats.binomtest(failed, n).proportion_ci(confidence, method="exact")
    return float(ci.low), float(ci.high)
