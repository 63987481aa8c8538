"""User-level DP: the unit is every record of one user, accounted two ways (and a baseline).

``privacy.unit=user`` protects all of one user's records at once: neighbouring data sets
differ by one user added or removed (``add_remove``), by one user's records replaced with
records whose gradients are zero (``zero_out``), or (ULS only) by one user replaced by
another (``replace_one``). Two training strategies give the guarantee (Charles, Ganesh,
McKenna, McMahan, Mitchell, Pillutla, Rush 2024, "Fine-Tuning Large Language Models with
User-Level Differential Privacy", Sec. 3), each with its own accountant here:

- **ULS** (user-level sampling): each step samples every *user* with probability
  q_u = B_u / U (Poisson over the U users, B_u the expected users per batch), takes up to k
  of the user's examples, clips the user's contribution (the sum or mean of those examples'
  gradients) to C and adds N(0, sigma^2 C^2 I) to the sum over sampled users. One user moves
  the released sum by at most C (2C under replace-one), so the run is DP-SGD over users:
  ``PoissonSampledDpEvent(q_u, GaussianDpEvent(sigma))`` per step (``uls_event``),
  accounted by any accountant the example-level Poisson sampler offers (pld, prv, rdp;
  replace-one: pld only). k does not enter the accounting.
- **ELS** (example-level sampling with a per-user bound): each user keeps at most k of its
  examples (the rest are dropped before training, a data-independent choice: k at random
  from a seeded stream, ``data/users.py``'s ``capped_indices``), then each step samples
  every kept *example* with probability q = B / N_kept and clips each example's gradient
  to C (plain DP-SGD).
  Removing one user removes j <= k sampled examples, j ~ Binomial(k, q) independently per
  step, each moving the sum by at most C, in the worst case in one direction. Per step the
  pair of output laws is dominated by the scalar mixture of Gaussians (Charles et al. 2024,
  Sec. 3, after Ganesh 2024, "Tight group-level DP guarantees for DP-SGD with sampling via
  mixture of Gaussians mechanisms", for Poisson sampling; vector-to-scalar domination by
  Choquette-Choo, Ganesh, Steinke, Thakurta 2023, Cor. 4.7):

      P = N(0, sigma^2),   Q = sum_{j=0..k} C(k, j) q^j (1 - q)^(k - j) N(j, sigma^2)

  (in units of C), compared in both directions (the user absent under P, present under Q:
  dp-accounting's ``MixtureOfGaussiansDpEvent(sigma, [0..k], Binomial(k, q) pmf)`` under
  ``ADD_OR_REMOVE_ONE``, whose PLD accountant builds the remove and the add PMFs). This is
  the tight ELS accountant (``els_event``). Only dp-accounting's PLD accountant analyses it
  (its RDP accountant and Opacus have no mixture-of-Gaussians event), and only under
  add/remove or zero-out (dp-accounting refuses ``REPLACE_ONE`` for it): ELS with any other
  accountant or relation is refused. At k = 1 the mixture is the Poisson-subsampled Gaussian,
  so ELS at k = 1 is example-level DP-SGD.
- **Group privacy** (the baseline a user-level number is compared to; Chua et al. 2024, "Mind
  the Privacy Unit!"): the example-level (eps', delta') of the same DP-SGD run, converted
  to groups of k records by induction over a chain of k neighbours (Dwork, Roth 2014,
  Thm 2.2 for pure DP; the approximate-DP form): a group of k is
  (k eps', delta' (e^(k eps') - 1) / (e^eps' - 1))-DP. This geometric sum is at most the
  textbook k e^((k-1) eps') delta' (equal at k = 1) and is what the induction gives exactly.
  ``group_privacy_epsilon`` picks the example-level delta' by bisection so that the group's
  delta is at most the target (every candidate it returns satisfies the constraint, so the
  returned epsilon is a valid bound whatever the bisection's precision).

Numerics: ULS epsilons are the project's Poisson accountant (``accountant.compose_epsilon``,
dpbench's cached dp-accounting PLD by default). ELS epsilons are dp-accounting's own
pessimistic connect-the-dots PLD of the mixture (``from_mixture_gaussian_mechanism``),
self-composed and composed exactly as its ``PLDAccountant`` does, on an interval chosen here
(``els_interval``): the project's default for the step count, coarsened until one step's grid
fits ``ELS_POINTS_BUDGET / (k + 1)`` points (building the mixture's PMF costs about k
evaluations per point, in Python). A coarser grid is only looser. Base PLDs and epsilons are
memoised, so a run's per-epoch queries rebuild nothing.

The combinations offered (``valid_combinations``) are checked by ``check_user_level``,
which refuses any other in one line naming the key. Calibration to a target epsilon goes
through the project's ``calibrate_noise_multiplier`` (``calibrate_user_noise_multiplier``).
See docs/privacy-unit-and-streams.md.

API (stable; the training integration builds on it):

- ``UNITS``, ``STRATEGIES``, ``check_unit``, ``check_strategy``,
  ``check_max_examples_per_user``: the config keys' values and one-line checks;
- ``valid_combinations()``, ``check_user_level(strategy, sampler, accountant, neighbouring)
  -> (relation, accountant)``: what is offered, defaults filled in, the rest refused;
- ``uls_event(user_rate, sigma, steps)``, ``els_event(example_rate, sigma, steps, k)``,
  ``user_dp_event(user, history)``, ``user_convention(user, relation)``: the dp-accounting
  events of a run (results.json's ``mechanism.event``) and how to read them;
- ``uls_epsilon``, ``els_epsilon`` / ``els_accounting``, ``user_epsilon(user, history,
  delta, accountant, neighbouring)``, ``group_privacy_epsilon(example_rate, sigma, steps, k,
  delta)``: the epsilons;
- ``calibrate_user_noise_multiplier(strategy, target, delta, rate, steps, k, accountant,
  neighbouring) -> (sigma, accountant)``;
- ``UserLevel(strategy, k)``: what ``PrivacyAccountant(..., user=UserLevel(...))`` needs to
  report user-level epsilons (its ``check`` and ``epsilon``; carried in its state dict);
- ``user_plan.plan_user_privacy(privacy, trainer, num_users, num_examples)`` -> (plan,
  user): the run's rate, steps, delta (< 1/U) and sigma before training.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dpbench.errors import ConfigError
from dpbench.privacy.accountant import (
    check_accountant,
    compose_epsilon,
    epsilon,
)
from dpbench.privacy.accountant_pld import (
    BASE_POINTS_CAP,
    LADDER,
    RESOLUTION,
    Group,
    canonical_groups,
    composed_epsilon,
    interval_for,
)
from dpbench.privacy.calibration import calibrate_noise_multiplier
from dpbench.privacy.samplers import (
    ADD_REMOVE,
    DEFAULT_SAMPLER,
    REPLACE_ONE,
    ZERO_OUT,
    Sampling,
    check_neighbouring,
    check_sampler,
    sampling_epsilon,
)

#: ``privacy.unit``: what one epsilon protects (the first is the default)
UNITS = ("example", "user")
DEFAULT_UNIT = "example"
#: ``privacy.user_strategy`` (the first is the default)
ULS, ELS = "uls", "els"
STRATEGIES = (ULS, ELS)
DEFAULT_STRATEGY = ULS
#: ``privacy.max_examples_per_user`` (k): its default and the largest accepted
DEFAULT_MAX_EXAMPLES_PER_USER = 8
MAX_EXAMPLES_PER_USER = 1024
#: grid points times mixture components of one ELS step's PMF (per direction): building it
#: evaluates k + 1 Gaussians per point in a Python loop (about 2 s at this budget on a
#: loaded 2-core machine), so the interval is coarsened until it fits
ELS_POINTS_BUDGET = 2**18

#: per strategy, per neighbouring relation (the first is the default), the accountants that
#: give an upper bound (the first is the default); the sampler is Poisson (over users for
#: ULS, over the kept examples for ELS)
_ACCOUNTANTS: dict[str, dict[str, tuple[str, ...]]] = {
    ULS: {ADD_REMOVE: ("pld", "prv", "rdp"), ZERO_OUT: ("pld", "prv", "rdp"),
          REPLACE_ONE: ("pld",)},
    ELS: {ADD_REMOVE: ("pld",), ZERO_OUT: ("pld",)},
}
_WHY = {
    ULS: "DP-SGD over users: a Poisson-subsampled Gaussian per step, under replace-one "
         "analysed by dp-accounting's PLD only",
    ELS: "the mixture-of-Gaussians event, which only dp-accounting's PLD accountant analyses, "
         "under add/remove or zero-out only",
}


@dataclass(frozen=True)
class Combination:
    """One accounted user-level setting: strategy, sampler, accountant, relation."""

    strategy: str
    sampler: str
    accountant: str
    neighbouring: str


def valid_combinations() -> tuple[Combination, ...]:
    """Return every (strategy, sampler, accountant, neighbouring) with a valid accountant."""
    return tuple(Combination(s, DEFAULT_SAMPLER, a, r)
                 for s, relations in _ACCOUNTANTS.items()
                 for r, accountants in relations.items() for a in accountants)


@dataclass(frozen=True)
class UserLevel:
    """What a user-level run's accountant needs besides (sigma, q, steps): the strategy and
    k, the most examples of one user a step may use (ULS) or the data set keeps (ELS)."""

    strategy: str = DEFAULT_STRATEGY
    max_examples_per_user: int = DEFAULT_MAX_EXAMPLES_PER_USER

    def __post_init__(self) -> None:
        check_strategy(self.strategy)
        check_max_examples_per_user(self.max_examples_per_user)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def check(self, sampler: str = DEFAULT_SAMPLER, accountant: str | None = None,
              neighbouring: str | None = None) -> tuple[str, str]:
        """Return (relation, accountant) of this strategy (``check_user_level``)."""
        return check_user_level(self.strategy, sampler, accountant, neighbouring)

    def epsilon(self, history: Iterable[Group], delta: float, accountant: str | None = None,
                neighbouring: str | None = None) -> float:
        """Return the user-level epsilon of a (sigma, q, steps) history (``user_epsilon``)."""
        return user_epsilon(self, history, delta, accountant, neighbouring)


def check_unit(unit: Any) -> str:
    """Return ``unit`` or raise a one-line ConfigError naming ``privacy.unit``."""
    if unit not in UNITS:
        raise ConfigError(f"privacy.unit must be one of {', '.join(UNITS)} (got {unit!r})")
    return unit


def check_strategy(strategy: Any) -> str:
    """Return ``strategy`` or raise a one-line ConfigError naming ``privacy.user_strategy``."""
    if strategy not in STRATEGIES:
        raise ConfigError(f"privacy.user_strategy must be one of {', '.join(STRATEGIES)} "
                          f"(uls: user-level sampling; els: example-level sampling with at most "
                          f"privacy.max_examples_per_user examples a user; got {strategy!r})")
    return strategy


def check_max_examples_per_user(k: Any) -> int:
    """Return k or raise a one-line ConfigError naming ``privacy.max_examples_per_user``."""
    if not (isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= MAX_EXAMPLES_PER_USER):
        raise ConfigError(f"privacy.max_examples_per_user must be an integer in "
                          f"[1, {MAX_EXAMPLES_PER_USER}] (got {k!r})")
    return k


def check_user_level(strategy: str, sampler: str = DEFAULT_SAMPLER,
                     accountant: str | None = None,
                     neighbouring: str | None = None) -> tuple[str, str]:
    """Return (relation, accountant) of a user-level run, defaults filled in; refuse a
    combination without a valid accountant in one line naming the key
    (``privacy.user_strategy``, ``trainer.sampler``, ``privacy.neighbouring``,
    ``privacy.accountant``)."""
    check_strategy(strategy)
    check_sampler(sampler)
    check_neighbouring(neighbouring)
    if accountant is not None:
        check_accountant(accountant)
    if sampler != DEFAULT_SAMPLER:
        raise ConfigError(f"trainer.sampler={sampler} has no user-level accountant "
                          f"(privacy.unit=user samples Poisson batches, over users for uls and "
                          f"over the kept examples for els); use trainer.sampler=poisson")
    relations = _ACCOUNTANTS[strategy]
    relation = neighbouring or next(iter(relations))
    if relation not in relations:
        raise ConfigError(f"privacy.neighbouring={relation} has no accountant for "
                          f"privacy.user_strategy={strategy} ({_WHY[strategy]}); use "
                          f"privacy.neighbouring={' or '.join(relations)}, or null")
    valid = relations[relation]
    if accountant is not None and accountant not in valid:
        raise ConfigError(f"privacy.accountant={accountant} has no accounting for "
                          f"privacy.user_strategy={strategy} under privacy.neighbouring="
                          f"{relation} ({_WHY[strategy]}); use privacy.accountant="
                          f"{' or '.join(valid)}")
    return relation, accountant or valid[0]


def _check_rate(key: str, rate: float) -> None:
    if not 0 < rate <= 1:
        raise ConfigError(f"{key} must be in (0, 1] (got {rate!r})")


def binomial_weights(k: int, q: float) -> list[float]:
    """Return P[j of k examples sampled] for j = 0..k at rate q (scipy's binomial pmf)."""
    from scipy import stats

    return [float(p) for p in stats.binom.pmf(np.arange(k + 1), k, q)]


def uls_event(user_rate: float, noise_multiplier: float, steps: int) -> Any:
    """Return the dp-accounting event of ``steps`` ULS steps: each a Poisson sample of users
    at rate q_u and a Gaussian of multiplier sigma relative to the per-user clip norm C."""
    from dp_accounting import dp_event as ev

    _check_rate("the user sampling rate", user_rate)
    step = ev.PoissonSampledDpEvent(float(user_rate), ev.GaussianDpEvent(float(noise_multiplier)))
    return ev.SelfComposedDpEvent(step, int(steps))


def els_event(example_rate: float, noise_multiplier: float, steps: int,
              max_examples_per_user: int) -> Any:
    """Return the dp-accounting event of ``steps`` ELS steps for one user of at most k
    examples: the mixture of Gaussians of standard deviation sigma (relative to C) with
    sensitivities 0, 1, ..., k and Binomial(k, q) weights (module docstring), read under
    ``ADD_OR_REMOVE_ONE`` (or ``REPLACE_SPECIAL``) by dp-accounting's PLD accountant."""
    from dp_accounting import dp_event as ev

    _check_rate("the example sampling rate", example_rate)
    k = check_max_examples_per_user(max_examples_per_user)
    step = ev.MixtureOfGaussiansDpEvent(float(noise_multiplier), [float(j) for j in range(k + 1)],
                                        binomial_weights(k, float(example_rate)))
    return ev.SelfComposedDpEvent(step, int(steps))


def user_dp_event(user: UserLevel, history: Iterable[Group]) -> Any:
    """Return the dp-accounting event of a user-level run's (sigma, q, steps) history (what
    results.json records as ``mechanism.event``): one ``uls_event`` or ``els_event`` per run
    of equal steps, composed."""
    from dp_accounting import dp_event as ev

    make = uls_event if user.strategy == ULS else (
        lambda q, s, n: els_event(q, s, n, user.max_examples_per_user))
    return ev.ComposedDpEvent([make(q, s, n) for s, q, n in history if n > 0 and q > 0])


def user_convention(user: UserLevel, relation: str = ADD_REMOVE) -> dict[str, Any]:
    """Return how ``user_dp_event``'s events are read (as ``samplers.convention`` does for
    example-level runs): the relation, the unit and strategy, what the multipliers are
    relative to (C: the per-user clip norm for ULS, the per-example one for ELS), and the
    dp-accounting accountant / ``NeighboringRelation`` pairs that give the epsilon."""
    from dpbench.privacy.samplers import DP_ACCOUNTING_RELATION, convention

    relation, _ = check_user_level(user.strategy, DEFAULT_SAMPLER, None, relation)
    if user.strategy == ULS:
        out = convention(Sampling(DEFAULT_SAMPLER, relation))
    else:  # the mixture under add/remove or zero-out, by dp-accounting's PLD only
        out = {"neighbouring": relation, "multiplier_relative_to": "C",
               "read_by": [{"accountant": "pld", "neighboring_relation":
                            DP_ACCOUNTING_RELATION[r]} for r in (ADD_REMOVE, ZERO_OUT)]}
    return {**out, "unit": "user", **user.to_json()}


# ---------------------------------------------------------------------------------------
# ELS: dp-accounting's PLD of the mixture of Gaussians, on a bounded grid, memoised


def _ladder_at_least(x: float) -> float:
    return min([v for v in LADDER if v >= x], default=LADDER[-1])


def _ladder_at_most(x: float) -> float:
    return max([v for v in LADDER if v <= x], default=LADDER[0])


@functools.lru_cache(maxsize=256)
def _mixture_span(sigma: float, q: float, k: int) -> float:
    """Return the widest privacy-loss support (over both directions) that connect-the-dots
    grids for one ELS step (dp-accounting's bounds; nothing is allocated)."""
    from dp_accounting.pld import privacy_loss_mechanism as plm

    weights = binomial_weights(k, q)
    span = 0.0
    for adjacency in (plm.AdjacencyType.REMOVE, plm.AdjacencyType.ADD):
        bounds = plm.MixtureGaussianPrivacyLoss(
            sigma, list(map(float, range(k + 1))), weights,
            adjacency_type=adjacency).connect_dots_bounds()
        span = max(span, bounds.epsilon_upper - bounds.epsilon_lower)
    return span


def els_interval(groups: Sequence[Group], max_examples_per_user: int,
                 finest: float = math.inf) -> float:
    """Return the discretisation interval ELS accounts ``groups`` at: the project's default
    for their total step count (``accountant_pld.interval_for``, or ``finest`` if smaller),
    coarsened on the 1-2-5 ladder until every step's grid has at most
    ``ELS_POINTS_BUDGET / (k + 1)`` points (and at most ``BASE_POINTS_CAP``)."""
    k = max_examples_per_user
    total = sum(n for _, _, n in groups)
    points = max(min(BASE_POINTS_CAP, ELS_POINTS_BUDGET // (k + 1)), 64)
    widest = max((_mixture_span(s, q, k) for s, q, _ in groups), default=0.0)
    return max(min(interval_for(total), _ladder_at_most(finest)),
               _ladder_at_least(widest / points))


@functools.lru_cache(maxsize=16)
def _mixture_pld(sigma: float, q: float, k: int, interval: float) -> Any:
    """Return dp-accounting's pessimistic connect-the-dots PLD of one ELS step (memoised)."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    return pld.from_mixture_gaussian_mechanism(
        standard_deviation=sigma, sensitivities=[float(j) for j in range(k + 1)],
        sampling_probs=binomial_weights(k, q), value_discretization_interval=interval)


def _els_compose(groups: tuple[Group, ...], k: int, interval: float, delta: float) -> float:
    return composed_epsilon(((_mixture_pld(sigma, q, k, interval), steps)
                             for sigma, q, steps in groups), delta)


@functools.lru_cache(maxsize=1024)
def _els_accounting(groups: tuple[Group, ...], k: int, delta: float) -> tuple[float, float]:
    interval = els_interval(groups, k)
    eps = _els_compose(groups, k, interval, delta)
    if math.isfinite(eps) and eps < RESOLUTION * interval:  # as accountant_pld.pld_epsilon
        finer = els_interval(groups, k, finest=max(eps, LADDER[0]) / RESOLUTION)
        if finer < interval:
            refined = _els_compose(groups, k, finer, delta)
            if refined < eps:
                return refined, finer
    return eps, interval


def els_accounting(history: Iterable[Group], max_examples_per_user: int,
                   delta: float) -> tuple[float, float]:
    """Return (epsilon, interval): the user-level epsilon at ``delta`` of ELS steps
    (sigma, q, steps) with at most k examples a user, and the discretisation interval it was
    computed at. It is dp-accounting's pessimistic PLD of the ``els_event``s, equal to its
    ``PLDAccountant`` composing them at that interval: ``els_interval``, and where the
    epsilon spans fewer than ``RESOLUTION`` intervals once more on a finer grid (within the
    same point budget), the smaller of the two upper bounds kept, as the Poisson PLD does."""
    k = check_max_examples_per_user(max_examples_per_user)
    groups = canonical_groups(history)
    if not groups:
        return 0.0, math.nan
    if any(s <= 0 for s, _, _ in groups):
        return math.inf, math.nan
    return _els_accounting(groups, k, float(delta))


def els_epsilon(history: Iterable[Group], max_examples_per_user: int, delta: float) -> float:
    """Return the user-level epsilon at ``delta`` of ELS steps (``els_accounting``)."""
    return els_accounting(history, max_examples_per_user, delta)[0]


def uls_epsilon(history: Iterable[Group], delta: float, accountant: str = "pld",
                neighbouring: str = ADD_REMOVE) -> float:
    """Return the user-level epsilon at ``delta`` of ULS steps (sigma, q_u, steps): the
    project's Poisson accountant read over users (``accountant.compose_epsilon``, where PRV
    falls back to PLD as for example-level runs; replace-one: ``samplers.sampling_epsilon``,
    dp-accounting's PLD under ``REPLACE_ONE``)."""
    relation, accountant = check_user_level(ULS, DEFAULT_SAMPLER, accountant, neighbouring)
    if relation != REPLACE_ONE:  # add/remove, zero-out: the Poisson accountant as it is
        return compose_epsilon(list(history), float(delta), accountant)  # PRV -> PLD, logged
    return sampling_epsilon(Sampling(DEFAULT_SAMPLER, relation), accountant, list(history),
                            float(delta), epsilon)


def user_epsilon(user: UserLevel, history: Iterable[Group], delta: float,
                 accountant: str | None = None, neighbouring: str | None = None) -> float:
    """Return the user-level epsilon of a run's (sigma, q, steps) history under ``user``,
    by the strategy's accountant (refused in one line where it has none)."""
    relation, accountant = check_user_level(user.strategy, DEFAULT_SAMPLER, accountant,
                                            neighbouring)
    if user.strategy == ULS:
        return uls_epsilon(history, delta, accountant, relation)
    return els_epsilon(history, user.max_examples_per_user, delta)


def _log_expm1(x: float) -> float:
    return x + math.log1p(-math.exp(-x)) if x > 0 else -math.inf


def log_group_privacy_delta(example_epsilon: float, log_example_delta: float,
                            group_size: int) -> float:
    """Return the log of the delta of a group of k from an example-level (eps', delta'):
    delta' (e^(k eps') - 1) / (e^eps' - 1) (k delta' at eps' = 0), the induction's sum, in
    logs (it overflows a float at large k eps')."""
    k = int(group_size)
    if example_epsilon <= 0:
        return math.log(k) + log_example_delta
    if math.isinf(example_epsilon):
        return math.inf
    return (log_example_delta + _log_expm1(k * example_epsilon)
            - _log_expm1(example_epsilon))


def group_privacy_delta(example_epsilon: float, example_delta: float, group_size: int) -> float:
    """Return the delta of a group of k from an example-level (eps', delta') (the induction's
    sum, ``log_group_privacy_delta``); at most k e^((k-1) eps') delta'."""
    log = log_group_privacy_delta(example_epsilon, math.log(example_delta), group_size)
    return math.exp(log) if log < 700 else math.inf


#: the smallest example-level delta' the group-privacy search tries (log); RDP's conversion
#: is still finite there
_LOG_DELTA_FLOOR = math.log(1e-300)


def group_privacy_epsilon(example_rate: float, noise_multiplier: float, steps: int,
                          group_size: int, delta: float, accountant: str = "pld",
                          iterations: int = 40) -> float:
    """Return the group-privacy epsilon of a group of k records at ``delta`` for example-level
    DP-SGD (sigma, q, steps): k eps'(delta') with delta' the largest found (bisection on
    log delta') whose group delta (``group_privacy_delta``) is at most ``delta``. Every
    returned value satisfies the constraint, so it is an upper bound; k = 1 gives the
    example-level epsilon at ``delta``; inf where no delta' >= 1e-300 satisfies it.
    eps'(delta') is ``accountant``'s; where it is infinite (the PLD moves a tail mass of up
    to 1e-15 to +infinity, and a large group needs a delta' below it) Opacus's RDP bound is
    used for that delta'."""
    k = int(group_size)
    if k < 1:
        raise ConfigError(f"privacy.max_examples_per_user must be >= 1 (got {group_size!r})")
    history = [(float(noise_multiplier), float(example_rate), int(steps))]

    @functools.cache
    def eps_at(log_d: float) -> float:
        d = math.exp(log_d)
        eps = compose_epsilon(history, d, accountant)
        if math.isinf(eps) and accountant != "rdp":
            # below the PLD's tail mass moved to +infinity (1e-15 a composition), a delta'
            # the group needs at large k: Opacus's RDP bound, also an upper bound
            eps = compose_epsilon(history, d, "rdp")
        return eps

    if k == 1:
        return compose_epsilon(history, delta, accountant)
    log_delta = math.log(delta)

    def ok(log_d: float) -> bool:
        return log_group_privacy_delta(eps_at(log_d), log_d, k) <= log_delta

    hi = log_delta - math.log(k)  # too large unless eps' = 0 (the group's delta >= k delta')
    if ok(hi):
        return k * eps_at(hi)
    lo = hi
    while True:  # go down until a delta' satisfies the constraint
        lo = max(lo - max((k - 1) * eps_at(lo), 1.0), _LOG_DELTA_FLOOR)
        if ok(lo):
            break
        if lo <= _LOG_DELTA_FLOOR:
            return math.inf
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-6:
            break
    return k * eps_at(lo)


def calibrate_user_noise_multiplier(
    strategy: str, target_epsilon: float, delta: float, rate: float, steps: int,
    max_examples_per_user: int = DEFAULT_MAX_EXAMPLES_PER_USER, accountant: str | None = None,
    neighbouring: str | None = None,
) -> tuple[float, str]:
    """Return (sigma, accountant) so that ``steps`` user-level steps at ``rate`` (q_u for ULS,
    the example rate q for ELS) spend at most ``target_epsilon`` user-level at ``delta``.

    Through the project's ``calibrate_noise_multiplier`` (same bracket, same tolerance, same
    one-line refusals naming ``privacy.target_epsilon``): ULS is DP-SGD over users, calibrated
    as the example-level Poisson sampler is; ELS is calibrated on its own accountant
    (``els_epsilon``).
    """
    relation, accountant = check_user_level(strategy, DEFAULT_SAMPLER, accountant,
                                            neighbouring)
    if strategy == ULS:
        return calibrate_noise_multiplier(target_epsilon, delta, rate, steps, accountant,
                                          Sampling(DEFAULT_SAMPLER, relation))
    k = check_max_examples_per_user(max_examples_per_user)

    def spend(sigma: float) -> float:
        return els_epsilon([(sigma, rate, steps)], k, delta)

    return calibrate_noise_multiplier(target_epsilon, delta, rate, steps, accountant,
                                      spend=spend)
