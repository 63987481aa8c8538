"""The accountants dpbench offers, the default delta, and a checkpointable run accountant.

Every accountant here returns an upper bound on epsilon for Poisson-subsampled Gaussian steps:

- ``pld`` (default): dp-accounting's privacy loss distributions with pessimistic
  connect-the-dots discretisation, grid sizes capped, compositions cached
  (``accountant_pld``). The tightest of the three.
- ``prv``: Opacus's PRV accountant (Gopi et al. 2021); its grid is sized first and a
  setting that would need more than ``PRV_POINTS_CAP`` points is refused or answered by PLD.
- ``rdp``: Opacus's RDP analysis (Mironov 2017), looser, one vector per distinct (sigma, q).

Opacus's GDP accountant is refused: it is a central-limit approximation (Dong, Roth, Su
2019; Bu et al. 2020), not a bound, and under-reports (calibrated to epsilon 3 on the demo it
reports 2.99 for a mechanism whose PLD epsilon is 3.37). See docs/accounting.md.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from dpbench.errors import ConfigError
from dpbench.privacy.accountant_opacus import (
    PRV_POINTS_CAP,
    GridTooLarge,
    prv_epsilon,
    prv_grid_points,
    rdp_epsilon,
)
from dpbench.privacy.accountant_pld import Group, canonical_groups, pld_epsilon
from dpbench.privacy.samplers import Sampling, sampling_epsilon
from dpbench.registry import Registry

log = logging.getLogger(__name__)

EpsilonFn = Callable[[tuple[Group, ...], float], float]
_REGISTRY: Registry[EpsilonFn] = Registry("accountant")


def register_accountant(name: str) -> Callable[[EpsilonFn], EpsilonFn]:
    """Register ``fn(groups, delta) -> epsilon`` under ``name``; duplicates are refused."""
    return _REGISTRY.register(name)


register_accountant("pld")(pld_epsilon)
register_accountant("prv")(prv_epsilon)
register_accountant("rdp")(rdp_epsilon)

ACCOUNTANTS = tuple(_REGISTRY)
DEFAULT_ACCOUNTANT = "pld"
#: names that exist elsewhere (Opacus) but do not give an upper bound, with the reason
REFUSED = {"gdp": "Opacus's GDP accountant is a central-limit approximation that "
                  "under-reports epsilon (not an upper bound)"}
#: noise multipliers accepted, fixed or calibrated. Below 0.01 one step alone spends an
#: epsilon in the thousands and dp-accounting's PLD overflows (at 1e-6); above 1e3 Opacus's
#: RDP analysis takes seconds per (sigma, q) (its series grows with sigma at q near 1/2)
NOISE_MULTIPLIER_MIN = 0.01
NOISE_MULTIPLIER_MAX = 1e3


def check_accountant(name: str) -> None:
    """Raise a one-line ConfigError naming ``privacy.accountant`` unless it is offered."""
    if name in REFUSED:
        raise ConfigError(f"privacy.accountant={name} is refused: {REFUSED[name]}; "
                          f"use one of {', '.join(ACCOUNTANTS)} (default {DEFAULT_ACCOUNTANT})")
    if name not in _REGISTRY:
        raise ConfigError(f"privacy.accountant must be one of {', '.join(ACCOUNTANTS)} "
                          f"(got {name!r})")


def default_delta(dataset_size: int) -> float:
    """Return min(1e-5, 1/N') with N' the smallest power of ten above N: delta < 1/N always."""
    above = 10 ** len(str(max(int(dataset_size), 1)))  # 10^digits(N) > N, exactly
    return min(1e-5, 1.0 / above)


def epsilon(accountant: str, history: Iterable[Group], delta: float) -> float:
    """Return ``accountant``'s upper bound on epsilon at ``delta`` for (sigma, q, steps) runs."""
    check_accountant(accountant)
    return _REGISTRY.get(accountant)(canonical_groups(history), float(delta))


def compose_epsilon(history: Iterable[Group], delta: float,
                    accountant: str = DEFAULT_ACCOUNTANT) -> float:
    """Return epsilon of running all (sigma, q, steps) in ``history`` (adaptive composition);
    PRV falls back to PLD (logged) where its grid would be too large."""
    try:
        return epsilon(accountant, history, delta)
    except GridTooLarge as err:
        if accountant != "prv":
            raise
        log.warning("%s; using the PLD accountant", err)
        return epsilon("pld", history, delta)


def check_accountable(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                      accountant: str) -> None:
    """Raise ConfigError before training if a fixed sigma cannot be accounted within bounds."""
    check_accountant(accountant)
    if not NOISE_MULTIPLIER_MIN <= noise_multiplier <= NOISE_MULTIPLIER_MAX:
        raise ConfigError(
            f"privacy.noise_multiplier must be in [{NOISE_MULTIPLIER_MIN:g}, "
            f"{NOISE_MULTIPLIER_MAX:g}] (got {noise_multiplier:g}): below, one step spends an "
            "epsilon in the thousands; use privacy=nonprivate for a non-private run")
    if accountant == "prv":
        groups = canonical_groups([(noise_multiplier, sample_rate, steps)])
        points = prv_grid_points(groups, delta)
        if not points <= PRV_POINTS_CAP:
            raise ConfigError(
                f"privacy.accountant=prv cannot account noise_multiplier={noise_multiplier:g} "
                f"at q={sample_rate:.4g} for {steps} steps: its grid would need {points:.3g} "
                f"points (limit {PRV_POINTS_CAP}); use privacy.accountant=pld (default) or rdp")


class PrivacyAccountant:
    """The run's accountant: (sigma, q, steps) history, epsilon on demand, checkpointable.

    The history is the whole state, so ``load_state_dict`` continues the same accountant.
    Epsilons are memoised per (history, delta) and computed per distinct (sigma, q) group.
    ``sampling``: the batch sampler the steps ran under (``samplers.py``; Poisson if None),
    which decides the events the history is accounted as. ``user``: a user-level run's
    strategy and k (``user_level.UserLevel``; None: example-level), whose history is
    (sigma, q, steps) with q the rate over users (ULS) or over the kept examples (ELS), and
    whose epsilon is user-level (its ``check`` and ``epsilon``: ``user_level.user_epsilon``).
    """

    def __init__(self, mechanism: str = DEFAULT_ACCOUNTANT,
                 sampling: Sampling | None = None, user: Any = None) -> None:
        check_accountant(mechanism)
        self.mechanism = mechanism
        self.sampling = sampling or Sampling()
        self.user = user
        if user is not None:  # refuse a strategy this accountant or relation cannot read
            user.check(self.sampling.sampler, mechanism, self.sampling.neighbouring)
        self.history: list[tuple[float, float, int]] = []

    def step(self, noise_multiplier: float, sample_rate: float, count: int = 1) -> None:
        """Record ``count`` steps of the Poisson-subsampled Gaussian with (sigma, q)."""
        if self.history and self.history[-1][:2] == (noise_multiplier, sample_rate):
            sigma, q, n = self.history[-1]
            self.history[-1] = (sigma, q, n + count)
        else:
            self.history.append((float(noise_multiplier), float(sample_rate), int(count)))

    @property
    def steps(self) -> int:
        return sum(n for _, _, n in self.history)

    def get_epsilon(self, delta: float) -> float:
        """Return epsilon spent so far (0 before any step); PRV falls back to PLD, logged."""
        if not self.history:
            return 0.0
        if self.user is not None:
            return self.user.epsilon(self.history, delta, self.mechanism,
                                     self.sampling.neighbouring)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return sampling_epsilon(self.sampling, self.mechanism, self.history, delta,
                                        epsilon)
        except Exception as err:
            if self.mechanism != "prv":
                raise
            log.warning("PRV epsilon failed (%s); reporting the PLD epsilon instead", err)
            self.mechanism = "pld"
            return sampling_epsilon(self.sampling, "pld", self.history, delta, epsilon)

    def state_dict(self) -> dict[str, Any]:
        state = {"mechanism": self.mechanism, "history": list(self.history),
                 "sampling": self.sampling.to_json()}
        if self.user is not None:  # example-level checkpoints stay as they were
            state["user"] = self.user.to_json()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_accountant(state["mechanism"])
        saved_user = state.get("user")
        mine = self.user.to_json() if self.user is not None else None
        if saved_user != mine:
            raise ConfigError(f"the checkpoint's accountant ran at privacy unit "
                              f"{saved_user or 'example'}, not this run's {mine or 'example'}; "
                              "resume with the same privacy.unit, privacy.user_strategy and "
                              "privacy.max_examples_per_user")
        saved = Sampling(**state["sampling"]) if state.get("sampling") else None
        plain = saved is None and self.sampling.ledger_spec() is None
        if saved != self.sampling and not plain:
            raise ConfigError(f"the checkpoint's accountant ran under {saved}, not this run's "
                              f"{self.sampling}; resume with the same trainer.sampler")
        self.mechanism = state["mechanism"]
        self.history = [(float(s), float(q), int(n)) for s, q, n in state["history"]]

