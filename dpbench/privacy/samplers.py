"""Each batch sampler with the accountant that is an upper bound for it (docs/sampling.md).

A sampler's accounting is stated as dp-accounting events (``dp_event_for``: the one place
they are built) under a neighbouring relation:

- ``poisson`` (add/remove one example): every example joins each step with probability
  q = B / N; a step is ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))``. Accounted by
  ``pld`` (default), ``prv`` or ``rdp`` (``accountant.py``).
- ``fixed_size`` (replace one example): each step draws exactly B of the N examples without
  replacement; a step is ``SampledWithoutReplacementDpEvent(N, B, GaussianDpEvent(sigma/2))``
  (Wang, Balle, Kasiviswanathan 2019, Thm 27). dp-accounting 0.6's PLD accountant has no
  such event, so only its RDP accountant (which has) is offered: ``privacy.accountant=rdp``.
- ``shuffle`` (replace one example): one permutation per epoch cut into fixed-size batches,
  so each example is in exactly one step of an epoch (or none: the dropped tail). No
  amplification is claimed: epoch e is one ``GaussianDpEvent(sigma/2)``, composed over the
  epochs the run started (the steps of an epoch see the example once; adaptive composition
  of the rest costs nothing, and the permutation, the same under both data sets, only mixes:
  joint convexity of the hockey-stick divergence).

sigma/2: the released sum of clipped gradients (clip norm C) changes by at most C when one
example is added or removed, but by up to 2C when one is replaced by another; with noise
sigma C, the Gaussian's multiplier relative to its replace-one sensitivity is sigma/2.

``balls_in_bins`` (each example assigned to one uniformly random step of the epoch; Chua et
al. 2025) has no accountant in dp-accounting 0.6 and is refused (``REFUSED``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dpbench.errors import ConfigError

ADD_REMOVE, REPLACE_ONE = "add_remove", "replace_one"
NEIGHBOURING = (ADD_REMOVE, REPLACE_ONE)
#: how much one example can move the clipped sum, in units of C, per relation
SENSITIVITY = {ADD_REMOVE: 1.0, REPLACE_ONE: 2.0}


@dataclass(frozen=True)
class SamplerAccounting:
    """What a sampler may be accounted with: its relations (the first is the default) and
    the accountants (``privacy.accountant``) that give an upper bound for it."""

    name: str
    neighbouring: tuple[str, ...]
    accountants: tuple[str, ...]
    note: str


_REGISTRY: dict[str, SamplerAccounting] = {}


def register_sampler_accounting(entry: SamplerAccounting) -> SamplerAccounting:
    """Register ``entry`` under its name; duplicates are refused."""
    if entry.name in _REGISTRY:
        raise ValueError(f"sampler {entry.name!r} is already registered")
    _REGISTRY[entry.name] = entry
    return entry


register_sampler_accounting(SamplerAccounting(
    "poisson", (ADD_REMOVE,), ("pld", "prv", "rdp"),
    "Poisson-subsampled Gaussian per step"))
register_sampler_accounting(SamplerAccounting(
    "fixed_size", (REPLACE_ONE,), ("rdp",),
    "Gaussian on a sample without replacement per step (RDP; dp-accounting's PLD has none)"))
register_sampler_accounting(SamplerAccounting(
    "shuffle", (REPLACE_ONE,), ("pld", "rdp"),
    "one unamplified Gaussian per epoch"))

SAMPLERS = tuple(_REGISTRY)
DEFAULT_SAMPLER = "poisson"
#: samplers that exist elsewhere but have no accountant here, with the reason
REFUSED = {"balls_in_bins": "dp-accounting 0.6 has no accountant for balls-in-bins batches"}


@dataclass(frozen=True)
class Sampling:
    """The sampler a run uses and what its accountant needs: the relation, N, B, T / epoch."""

    sampler: str = DEFAULT_SAMPLER
    neighbouring: str = ADD_REMOVE
    dataset_size: int = 0
    batch_size: int = 0  # B (Poisson: the expected batch size)
    steps_per_epoch: int = 1

    @property
    def poisson(self) -> bool:
        return self.sampler == "poisson"

    @property
    def sensitivity(self) -> float:
        """The clipped sum's sensitivity in units of C under the run's relation."""
        return SENSITIVITY[self.neighbouring]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def check_sampler(name: str) -> SamplerAccounting:
    """Return ``name``'s accounting, or raise a one-line ConfigError naming trainer.sampler."""
    if name in REFUSED:
        raise ConfigError(f"trainer.sampler={name} is refused: {REFUSED[name]}; use one of "
                          f"{', '.join(SAMPLERS)}")
    if name not in _REGISTRY:
        raise ConfigError(f"trainer.sampler must be one of {', '.join(SAMPLERS)} (got {name!r})")
    return _REGISTRY[name]


def check_neighbouring(name: str | None) -> None:
    if name is not None and name not in NEIGHBOURING:
        raise ConfigError(f"privacy.neighbouring must be one of {', '.join(NEIGHBOURING)} or "
                          f"null (the sampler's own; got {name!r})")


def resolve_sampling(sampler: str, neighbouring: str | None, accountant: str,
                     private: bool = True) -> str:
    """Return the run's neighbouring relation; refuse a combination without an accountant.

    Raises a one-line ConfigError naming the key: ``trainer.sampler``,
    ``privacy.neighbouring`` or ``privacy.accountant``.
    """
    entry = check_sampler(sampler)
    check_neighbouring(neighbouring)
    relation = neighbouring or entry.neighbouring[0]
    if relation not in entry.neighbouring:
        raise ConfigError(f"privacy.neighbouring={relation} has no valid accountant for "
                          f"trainer.sampler={sampler} (it is accounted under "
                          f"{' or '.join(entry.neighbouring)}); use privacy.neighbouring="
                          f"{entry.neighbouring[0]} or null")
    if private and accountant not in entry.accountants:
        raise ConfigError(f"privacy.accountant={accountant} has no accounting for "
                          f"trainer.sampler={sampler} ({entry.note}); use privacy.accountant="
                          f"{' or '.join(entry.accountants)}")
    return relation


def dp_event_for(sampling: Sampling, history: Iterable[tuple[float, float, int]]) -> Any:
    """Return the dp-accounting event of ``history`` (sigma, q, steps) run under ``sampling``.

    The one place where dpbench states a run's mechanism as dp-accounting events (see the
    module docstring); ``sampling_epsilon`` computes what these events spend.

    Convention: each ``GaussianDpEvent``'s multiplier is relative to the largest shift of
    the released sum between neighbours (C under add/remove, 2C under replace-one), the
    convention of dp-accounting's RDP accountant under every relation. dp-accounting's PLD
    accountant under ``REPLACE_ONE`` doubles a Gaussian's sensitivity itself (its
    ``AdjacencyType.REPLACE``), so these events are composed by RDP, or by PLD under
    ``ADD_OR_REMOVE_ONE`` (a Gaussian's shift is then its sensitivity), never by PLD under
    ``REPLACE_ONE`` (that would count the factor 2 twice; see ``events_relation``).
    """
    from dp_accounting import dp_event as ev

    events: list[Any] = []
    if sampling.sampler == "shuffle":
        for sigma in epoch_noise(sampling, history):
            events.append(ev.GaussianDpEvent(sigma / sampling.sensitivity))
    else:
        for sigma, q, steps in history:
            if steps <= 0:
                continue
            gaussian = ev.GaussianDpEvent(sigma / sampling.sensitivity)
            if sampling.sampler == "poisson":
                step = ev.PoissonSampledDpEvent(q, gaussian)
            else:
                step = ev.SampledWithoutReplacementDpEvent(
                    sampling.dataset_size, sampling.batch_size, gaussian)
            events.append(ev.SelfComposedDpEvent(step, int(steps)))
    return ev.ComposedDpEvent(events)


def epoch_noise(sampling: Sampling, history: Iterable[tuple[float, float, int]]) -> list[float]:
    """Return, per epoch started, the smallest noise multiplier of its steps (an example's
    one step in that epoch may be any of them: the smallest is the worst case)."""
    per = max(int(sampling.steps_per_epoch), 1)
    out: list[float] = []
    done = 0
    for sigma, _, steps in history:
        for _ in range(int(steps)):
            if done % per == 0:
                out.append(float(sigma))
            else:
                out[-1] = min(out[-1], float(sigma))
            done += 1
    return out


def events_relation(sampling: Sampling) -> Any:
    """Return the dp-accounting relation to compose ``dp_event_for``'s events under: the
    run's own where the event has a sampling step (it changes what sampling does), and
    ``ADD_OR_REMOVE_ONE`` for the plain Gaussians of ``shuffle`` (see ``dp_event_for``)."""
    return neighbouring_relation(ADD_REMOVE if sampling.sampler == "shuffle"
                                 else sampling.neighbouring)


def neighbouring_relation(relation: str) -> Any:
    """Return dp-accounting's ``NeighboringRelation`` for ``relation``."""
    from dp_accounting import privacy_accountant as pa

    return {ADD_REMOVE: pa.NeighboringRelation.ADD_OR_REMOVE_ONE,
            REPLACE_ONE: pa.NeighboringRelation.REPLACE_ONE}[relation]


def sampling_epsilon(sampling: Sampling, accountant: str,
                     history: Sequence[tuple[float, float, int]], delta: float,
                     poisson_epsilon: Callable[[str, Any, float], float]) -> float:
    """Return the upper bound on epsilon of ``history`` run under ``sampling``.

    ``poisson_epsilon(accountant, groups, delta)`` is the (cached, grid-capped) accountant
    of Poisson-subsampled Gaussian groups (``accountant.epsilon``): Poisson runs use it as
    they are, and ``shuffle``'s epochs are groups at q = 1 (a Poisson step at rate 1 is the
    Gaussian mechanism itself). ``fixed_size`` composes its events with dp-accounting's RDP
    accountant under replace-one.
    """
    if not history:
        return 0.0
    if sampling.poisson:
        return poisson_epsilon(accountant, history, delta)
    if sampling.sampler == "shuffle":
        groups = [(s / sampling.sensitivity, 1.0, 1) for s in epoch_noise(sampling, history)]
        return poisson_epsilon(accountant, groups, delta)
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    acc = rdp.RdpAccountant(neighboring_relation=neighbouring_relation(sampling.neighbouring))
    acc.compose(dp_event_for(sampling, history))
    return float(acc.get_epsilon(delta))


def epoch_count(sampling: Sampling, steps: int) -> int:
    """Return the epochs ``steps`` steps start (a partial epoch counts whole)."""
    return math.ceil(steps / max(sampling.steps_per_epoch, 1))
