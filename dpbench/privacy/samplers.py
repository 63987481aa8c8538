"""Each batch sampler with the accountant that is an upper bound for it (docs/sampling.md).

A sampler's accounting is stated as dp-accounting events (``dp_event_for``: the one place
they are built) under a neighbouring relation (``privacy.neighbouring``):

- ``add_remove``: one example added or removed; the clipped sum moves by at most C.
- ``replace_one``: one example replaced by another; the clipped sum moves by up to 2C.
- ``zero_out``: one example replaced by one whose gradient is zero (dp-accounting's
  ``REPLACE_SPECIAL``); the clipped sum moves by at most C, and N stays fixed.

The samplers:

- ``poisson``: every example joins each step with probability q = B / N; a step is
  ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))``. Under add/remove (default) or
  zero-out (the same privacy loss) accounted by ``pld``, ``prv`` or ``rdp``; under
  replace-one by ``pld`` only (dp-accounting's PLD accountant analyses the subsampled
  Gaussian under ``REPLACE_ONE``, doubling the sensitivity itself; its RDP accountant and
  Opacus's have no replace-one analysis of Poisson sampling).
- ``fixed_size`` (replace-one): each step draws exactly B of the N examples without
  replacement; a step is ``SampledWithoutReplacementDpEvent(N, B, GaussianDpEvent(sigma/2))``
  (Wang, Balle, Kasiviswanathan 2019, Thm 27). dp-accounting 0.6's PLD accountant has no
  such event, so only its RDP accountant (which has) is offered: ``privacy.accountant=rdp``.
- ``shuffle`` (replace-one, or zero-out): one permutation per epoch cut into fixed-size
  batches, so each example is in exactly one step of an epoch (or none: the dropped tail).
  No amplification is claimed: epoch e is one ``GaussianDpEvent(sigma / s)`` (s = 2 under
  replace-one, 1 under zero-out), composed over the epochs the run started (the steps of an
  epoch see the example once; adaptive composition of the rest costs nothing, and the
  permutation, the same under both data sets, only mixes: joint convexity of the
  hockey-stick divergence).

The convention of the events' multipliers (relative to C or to 2C) and the dp-accounting
accountant/relation pairs that read them correctly are stated by ``convention``, which
results.json records next to the event.

``balls_in_bins`` (each example assigned to one uniformly random step of the epoch; Chua et
al. 2025) has no accountant in dp-accounting 0.6 and is refused (``REFUSED``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dpbench.errors import ConfigError

ADD_REMOVE, REPLACE_ONE, ZERO_OUT = "add_remove", "replace_one", "zero_out"
NEIGHBOURING = (ADD_REMOVE, REPLACE_ONE, ZERO_OUT)
#: how much one example can move the clipped sum, in units of C, per relation
SENSITIVITY = {ADD_REMOVE: 1.0, REPLACE_ONE: 2.0, ZERO_OUT: 1.0}
#: how tables and logs name a relation
RELATION_LABEL = {ADD_REMOVE: "add/remove", REPLACE_ONE: "replace-one", ZERO_OUT: "zero-out"}
#: dp-accounting's name of each relation (``NeighboringRelation``)
DP_ACCOUNTING_RELATION = {ADD_REMOVE: "ADD_OR_REMOVE_ONE", REPLACE_ONE: "REPLACE_ONE",
                          ZERO_OUT: "REPLACE_SPECIAL"}


@dataclass(frozen=True)
class SamplerAccounting:
    """What a sampler may be accounted with: per relation (the first is the default) the
    accountants (``privacy.accountant``, the first is the default) that give an upper bound."""

    name: str
    accountants: Mapping[str, tuple[str, ...]]
    note: str

    @property
    def neighbouring(self) -> tuple[str, ...]:
        return tuple(self.accountants)


_REGISTRY: dict[str, SamplerAccounting] = {}


def register_sampler_accounting(entry: SamplerAccounting) -> SamplerAccounting:
    """Register ``entry`` under its name; duplicates are refused."""
    if entry.name in _REGISTRY:
        raise ValueError(f"sampler {entry.name!r} is already registered")
    _REGISTRY[entry.name] = entry
    return entry


register_sampler_accounting(SamplerAccounting(
    "poisson", {ADD_REMOVE: ("pld", "prv", "rdp"), REPLACE_ONE: ("pld",),
                ZERO_OUT: ("pld", "prv", "rdp")},
    "Poisson-subsampled Gaussian per step; under replace-one only dp-accounting's PLD "
    "analyses it"))
register_sampler_accounting(SamplerAccounting(
    "fixed_size", {REPLACE_ONE: ("rdp",)},
    "Gaussian on a sample without replacement per step (RDP; dp-accounting's PLD has none)"))
register_sampler_accounting(SamplerAccounting(
    "shuffle", {REPLACE_ONE: ("pld", "rdp"), ZERO_OUT: ("pld", "rdp")},
    "one unamplified Gaussian per epoch"))

SAMPLERS = tuple(_REGISTRY)
DEFAULT_SAMPLER = "poisson"
#: samplers that exist elsewhere but have no accountant here, with the reason
REFUSED = {"balls_in_bins": "dp-accounting 0.6 has no accountant for balls-in-bins batches"}


def steps_per_epoch(dataset_size: int, batch_size: int) -> int:
    """Return T, the steps of an epoch for N examples at batch size B: int(1 / q) with
    q = B / N, as Opacus's DPDataLoader (every sampler; ``shuffle`` drops the last N - T B
    examples of each permutation)."""
    return max(int(1 / (int(batch_size) / int(dataset_size))), 1)


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
    def plain(self) -> bool:
        """Whether the Poisson accountant reads the run as it is: Poisson under add/remove
        or zero-out (the same privacy loss, dp-accounting's ``REPLACE_SPECIAL``)."""
        return self.poisson and self.neighbouring in (ADD_REMOVE, ZERO_OUT)

    def ledger_spec(self) -> dict[str, Any] | None:
        """Return what the run's ledger entries carry as ``sampling``: None for Poisson under
        add/remove (the ledger's default, as every earlier record), else ``to_json``."""
        return None if self.poisson and self.neighbouring == ADD_REMOVE else self.to_json()

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


def resolve_sampling(sampler: str, neighbouring: str | None, accountant: str | None,
                     private: bool = True) -> str:
    """Return the run's neighbouring relation; refuse a combination without an accountant.

    ``accountant`` None: the sampler's default for the relation (``default_accountant``).
    Raises a one-line ConfigError naming the key: ``trainer.sampler``,
    ``privacy.neighbouring`` or ``privacy.accountant``.
    """
    entry = check_sampler(sampler)
    check_neighbouring(neighbouring)
    relation = neighbouring or entry.neighbouring[0]
    if relation not in entry.accountants:
        raise ConfigError(f"privacy.neighbouring={relation} has no valid accountant for "
                          f"trainer.sampler={sampler} (it is accounted under "
                          f"{' or '.join(entry.neighbouring)}); use privacy.neighbouring="
                          f"{' or '.join(entry.neighbouring)}, or null")
    valid = entry.accountants[relation]
    if private and accountant is not None and accountant not in valid:
        raise ConfigError(f"privacy.accountant={accountant} has no accounting for "
                          f"trainer.sampler={sampler} under privacy.neighbouring={relation} "
                          f"({entry.note}); use privacy.accountant={' or '.join(valid)}")
    return relation


def default_accountant(sampler: str, relation: str) -> str:
    """Return the accountant chosen when ``privacy.accountant`` is null: the first valid one
    for ``sampler`` under ``relation`` (pld, or rdp for ``fixed_size``)."""
    return check_sampler(sampler).accountants[relation][0]


def event_divisor(sampling: Sampling) -> float:
    """Return what the noise multiplier sigma (relative to C) is divided by in the events:
    the relation's sensitivity (``SENSITIVITY``) for ``shuffle`` and ``fixed_size``, whose
    events are read by accountants that take a Gaussian's multiplier relative to the shift;
    1 for ``poisson``, whose replace-one events only dp-accounting's PLD reads, which doubles
    the sensitivity itself (``convention``)."""
    return 1.0 if sampling.poisson else sampling.sensitivity


def dp_event_for(sampling: Sampling, history: Iterable[tuple[float, float, int]]) -> Any:
    """Return the dp-accounting event of ``history`` (sigma, q, steps) run under ``sampling``.

    The one place where dpbench states a run's mechanism as dp-accounting events (see the
    module docstring); ``sampling_epsilon`` computes what these events spend, and
    ``convention`` states what their multipliers are relative to and which dp-accounting
    accountant/relation pairs read them correctly.
    """
    from dp_accounting import dp_event as ev

    events: list[Any] = []
    divisor = event_divisor(sampling)
    if sampling.sampler == "shuffle":
        for sigma in epoch_noise(sampling, history):
            events.append(ev.GaussianDpEvent(sigma / divisor))
    else:
        for sigma, q, steps in history:
            if steps <= 0:
                continue
            gaussian = ev.GaussianDpEvent(sigma / divisor)
            if sampling.poisson:
                step = ev.PoissonSampledDpEvent(q, gaussian)
            else:
                step = ev.SampledWithoutReplacementDpEvent(
                    sampling.dataset_size, sampling.batch_size, gaussian)
            events.append(ev.SelfComposedDpEvent(step, int(steps)))
    return ev.ComposedDpEvent(events)


def convention(sampling: Sampling) -> dict[str, Any]:
    """Return how ``dp_event_for``'s events are to be read (results.json's
    ``mechanism.convention``): the run's relation, what each Gaussian's multiplier is
    relative to (``C`` or ``2C``, C the clip norm), and the dp-accounting accountant /
    ``NeighboringRelation`` pairs that give the run's epsilon from them.

    dp-accounting's two accountants differ: its PLD accountant under ``REPLACE_ONE`` doubles
    a Gaussian's sensitivity itself, its RDP accountant does not. A pair outside
    ``read_by`` would count the factor 2 twice or not at all (``check_reading``).
    """
    relation = sampling.neighbouring
    relative = "2C" if event_divisor(sampling) == 2.0 else "C"
    ar, ro, rs = (DP_ACCOUNTING_RELATION[r] for r in (ADD_REMOVE, REPLACE_ONE, ZERO_OUT))
    if sampling.poisson:
        pairs = [("pld", ro)] if relation == REPLACE_ONE else [
            ("pld", ar), ("pld", rs), ("rdp", ar), ("rdp", rs)]
    elif sampling.sampler == "fixed_size":
        pairs = [("rdp", ro)]
    elif relation == REPLACE_ONE:  # shuffle: plain Gaussians relative to 2C
        pairs = [("pld", ar), ("pld", rs), ("rdp", ar), ("rdp", ro), ("rdp", rs)]
    else:  # shuffle under zero-out: plain Gaussians relative to C
        pairs = [("pld", ar), ("pld", rs), ("rdp", ar), ("rdp", rs)]
    return {"neighbouring": relation, "multiplier_relative_to": relative,
            "read_by": [{"accountant": a, "neighboring_relation": r} for a, r in pairs]}


def check_reading(conv: Mapping[str, Any], accountant: str, relation: str) -> None:
    """Raise ValueError (one line) unless dp-accounting's ``accountant`` ("pld" or "rdp")
    under ``NeighboringRelation.<relation>`` reads events of convention ``conv`` correctly."""
    pairs = [(p.get("accountant"), p.get("neighboring_relation"))
             for p in conv.get("read_by", []) if isinstance(p, Mapping)]
    if (accountant, relation) not in pairs:
        raise ValueError(
            f"mechanism.convention: dp-accounting's {accountant} under {relation} does not read "
            f"these events (multipliers relative to {conv.get('multiplier_relative_to')} under "
            f"{conv.get('neighbouring')}; it would count the replace-one factor 2 twice or not "
            f"at all); read them with one of {', '.join(f'{a} {r}' for a, r in pairs)}")


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
    """Return the dp-accounting relation dpbench composes ``dp_event_for``'s events under:
    the first pair of ``convention``'s ``read_by`` for PLD where it has one (``poisson``,
    ``shuffle``), else for RDP (``fixed_size``)."""
    from dp_accounting import privacy_accountant as pa

    pairs = convention(sampling)["read_by"]
    pick = next((p for p in pairs if p["accountant"] == "pld"), pairs[0])
    return pa.NeighboringRelation[pick["neighboring_relation"]]


def neighbouring_relation(relation: str) -> Any:
    """Return dp-accounting's ``NeighboringRelation`` for ``relation``."""
    from dp_accounting import privacy_accountant as pa

    return pa.NeighboringRelation[DP_ACCOUNTING_RELATION[relation]]


def sampling_epsilon(sampling: Sampling, accountant: str,
                     history: Sequence[tuple[float, float, int]], delta: float,
                     poisson_epsilon: Callable[[str, Any, float], float]) -> float:
    """Return the upper bound on epsilon of ``history`` run under ``sampling``.

    ``poisson_epsilon(accountant, groups, delta)`` is the (cached, grid-capped) accountant
    of Poisson-subsampled Gaussian groups under add/remove (``accountant.epsilon``): Poisson
    runs under add/remove or zero-out (the same privacy loss) use it as they are, and
    ``shuffle``'s epochs are groups at q = 1 (a Poisson step at rate 1 is the Gaussian
    mechanism itself) at sigma over the relation's sensitivity. Poisson under replace-one
    is dp-accounting's PLD under ``REPLACE_ONE`` (``accountant_pld.pld_epsilon(...,
    replace=True)``, grid-capped as the rest). ``fixed_size`` composes its events with
    dp-accounting's RDP accountant under replace-one.
    """
    if not history:
        return 0.0
    if sampling.poisson and sampling.neighbouring == REPLACE_ONE:
        from dpbench.privacy.accountant_pld import canonical_groups, pld_epsilon

        if accountant != "pld":
            raise ConfigError(f"privacy.accountant={accountant} has no accounting for "
                              "trainer.sampler=poisson under privacy.neighbouring=replace_one; "
                              "use privacy.accountant=pld")
        return pld_epsilon(canonical_groups(history), float(delta), replace=True)
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


def settled_accountant(privacy: Mapping[str, Any], trainer: Mapping[str, Any]) -> Any:
    """Return a config's ``privacy.accountant``, null replaced by the accountant a run
    chooses for it (``default_accountant``), so that a setting left to its default and the
    same accountant named explicitly key runs and tuned cells alike; the value as it is
    where the sampler or relation is not valid (the run refuses it later)."""
    accountant = privacy.get("accountant")
    if accountant is not None:
        return accountant
    try:
        sampler = trainer.get("sampler") or DEFAULT_SAMPLER
        relation = resolve_sampling(sampler, privacy.get("neighbouring"), None, False)
        return default_accountant(sampler, relation)
    except ConfigError:
        return accountant


def with_settled_accountant(settings: dict[str, Any]) -> dict[str, Any]:
    """Return a config's settings (plain dicts) with ``privacy.accountant`` settled
    (``settled_accountant``): what resume fingerprints and tuned cells' keys hash, so runs
    and choices written when the default was ``pld`` still match."""
    privacy, trainer = settings.get("privacy"), settings.get("trainer")
    if not isinstance(privacy, dict):
        return settings
    trainer = trainer if isinstance(trainer, dict) else {}
    return {**settings, "privacy": {**privacy,
                                    "accountant": settled_accountant(privacy, trainer)}}
