"""Re-account a run's mechanism along other paths than the accountant that reported it.

A run accounts with its ``privacy.accountant`` (dpbench's grouped, grid-capped, cached use of
dp-accounting's PLD by default; Opacus's PRV or RDP on request). ``event_epsilon`` re-accounts
results.json's ``mechanism.event`` (the run's dp-accounting ``DpEvent``, ``privacy/ledger.py``)
with the run's accountant, from the event alone: it must equal the reported epsilon.
``event_pld_epsilon`` hands the same event to dp-accounting's own generic event-by-event
``PLDAccountant`` on a fixed fine grid (Koskela et al. 2020; Doroshenko et al. 2022), and
``pld_epsilon`` does the same from a Poisson ledger's raw per-query sensitivities and noise
(each entry: ``steps`` Poisson-subsampled Gaussians at rate q whose queries compose into one
with multiplier (sum_k sigma_k^-2)^(-1/2), recomputed rather than read from the entry), so a
mis-recorded mechanism or an under-reporting accountant shows up as a mismatch.

Checking a file's ledger and epsilon against the mechanism it names, and re-deriving a
non-Poisson ledger, is ``privacy/record_check.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from dpbench.privacy.accountant import compose_epsilon
from dpbench.privacy.ledger import from_json


def ledger_noise_multiplier(entry: Mapping[str, Any]) -> float:
    """Return (sum_k (noise_std_k / sensitivity_k)^-2)^(-1/2) from an entry's raw queries."""
    inv = 0.0
    for q in entry["queries"]:
        if q["sensitivity"] <= 0:
            continue  # a query of sensitivity 0 reveals nothing
        if q["noise_std"] <= 0:
            return 0.0
        inv += (q["sensitivity"] / q["noise_std"]) ** 2
    return inv**-0.5 if inv > 0 else math.inf


def pld_epsilon(ledger: Iterable[Mapping[str, Any]], delta: float,
                discretization: float = 1e-4) -> float:
    """Return epsilon at ``delta`` of the ledger's mechanisms by dp-accounting's PLD accountant."""
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant(
        value_discretization_interval=discretization)
    any_step = False
    for entry in ledger:
        sigma = ledger_noise_multiplier(entry)
        if entry["steps"] <= 0 or math.isinf(sigma):
            continue
        if sigma == 0.0:
            return math.inf
        event = dp_event.PoissonSampledDpEvent(
            sampling_probability=float(entry["sample_rate"]),
            event=dp_event.GaussianDpEvent(noise_multiplier=sigma))
        accountant.compose(event, count=int(entry["steps"]))
        any_step = True
    return float(accountant.get_epsilon(delta)) if any_step else 0.0


def _groups(event: Any, count: int = 1) -> list[tuple[float, float, int]] | None:
    """Return the (sigma, q, steps) groups of a run's event; None if it is not private."""
    from dp_accounting import dp_event

    if isinstance(event, dp_event.ComposedDpEvent):
        out: list[tuple[float, float, int]] = []
        for part in event.events:
            groups = _groups(part, count)
            if groups is None:
                return None
            out += groups
        return out
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return _groups(event.event, count * int(event.count))
    if isinstance(event, dp_event.NonPrivateDpEvent):
        return None
    if isinstance(event, dp_event.GaussianDpEvent):  # unsampled: a Poisson step at q = 1
        return [(float(event.noise_multiplier), 1.0, count)]
    if isinstance(event, dp_event.PoissonSampledDpEvent):
        inner = event.event
        if isinstance(inner, dp_event.NoOpDpEvent):
            return []
        if isinstance(inner, dp_event.NonPrivateDpEvent):
            return None
        if not isinstance(inner, dp_event.GaussianDpEvent):
            raise ValueError(f"cannot re-account {inner!r} under Poisson sampling")
        return [(float(inner.noise_multiplier), float(event.sampling_probability), count)]
    raise ValueError(f"cannot re-account a {type(event).__name__}")


def _contains(event: Any, kind: type) -> bool:
    """Return whether ``kind`` occurs anywhere in the event tree."""
    from dp_accounting import dp_event

    if isinstance(event, kind):
        return True
    if isinstance(event, dp_event.ComposedDpEvent):
        return any(_contains(e, kind) for e in event.events)
    if isinstance(event, (dp_event.SelfComposedDpEvent, dp_event.PoissonSampledDpEvent,
                          dp_event.SampledWithoutReplacementDpEvent)):
        return _contains(event.event, kind)
    return False


def legacy_convention(event: Any) -> dict[str, Any]:
    """Return the convention of an event recorded before results.json stated one: Poisson
    events under add/remove, a ``shuffle`` or ``fixed_size`` run's events under replace-one
    relative to 2C (what dpbench wrote then; ``samplers.convention``)."""
    from dp_accounting import dp_event

    from dpbench.privacy.samplers import ADD_REMOVE, REPLACE_ONE, Sampling, convention

    if _contains(event, dp_event.SampledWithoutReplacementDpEvent):
        return convention(Sampling("fixed_size", REPLACE_ONE))
    if _contains(event, dp_event.PoissonSampledDpEvent) or not _contains(
            event, dp_event.GaussianDpEvent):
        return convention(Sampling("poisson", ADD_REMOVE))
    return convention(Sampling("shuffle", REPLACE_ONE))


def _checked_convention(event: Any, conv: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """Return ``conv`` (or the legacy one) if it is a convention dpbench writes for the kind
    of ``event``; ValueError (one line) otherwise."""
    from dp_accounting import dp_event

    from dpbench.privacy.samplers import NEIGHBOURING, REPLACE_ONE

    if conv is None:
        return legacy_convention(event)
    if not isinstance(conv, Mapping) or conv.get("neighbouring") not in NEIGHBOURING or conv.get(
            "multiplier_relative_to") not in ("C", "2C"):
        raise ValueError(f"mechanism.convention is not a convention ({conv!r})")
    if conv["multiplier_relative_to"] == "2C" and conv["neighbouring"] != REPLACE_ONE:
        raise ValueError("mechanism.convention: multipliers relative to 2C under "
                         f"{conv['neighbouring']} (a shift of C) would halve the noise")
    swor = _contains(event, dp_event.SampledWithoutReplacementDpEvent)
    if swor and (conv["neighbouring"], conv["multiplier_relative_to"]) != (REPLACE_ONE, "2C"):
        raise ValueError("mechanism.convention: sampling without replacement is accounted "
                         "under replace_one relative to 2C only")
    return conv


def els_groups(event: Any, count: int = 1) -> tuple[int, list[tuple[float, float, int]]] | None:
    """Return (k, the (sigma, q, steps) groups) of an ELS event (``user_level.els_event``:
    mixtures of Gaussians with sensitivities 0..k and Binomial(k, q) weights, composed or
    self-composed); None if the event holds no mixture. ValueError (one line) for a mixture
    of another shape, two values of k, or a mixture composed with another kind of event:
    none of them is a mechanism dpbench runs, so none is re-accounted."""
    from dp_accounting import dp_event

    from dpbench.privacy.user_level import binomial_weights

    if not _contains(event, dp_event.MixtureOfGaussiansDpEvent):
        return None
    if isinstance(event, dp_event.ComposedDpEvent):
        parts = [els_groups(e, count) for e in event.events]
        if any(p is None for p in parts) or len({p[0] for p in parts}) > 1:  # type: ignore[index]
            raise ValueError("cannot re-account a mixture of Gaussians composed with another "
                             "kind of event or another cap k")
        return parts[0][0], [g for p in parts for g in p[1]]  # type: ignore[index]
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return els_groups(event.event, count * int(event.count))
    if not isinstance(event, dp_event.MixtureOfGaussiansDpEvent):
        raise ValueError(f"cannot re-account a mixture of Gaussians inside a "
                         f"{type(event).__name__}")
    sens = [float(c) for c in event.sensitivities]
    k = len(sens) - 1
    probs = [float(p) for p in event.sampling_probs]
    if k < 1 or sens != [float(j) for j in range(k + 1)]:
        raise ValueError(f"a mixture of Gaussians with sensitivities {sens} is not an ELS step "
                         "(sensitivities 0, 1, ..., k)")
    q = sum(j * p for j, p in enumerate(probs)) / k  # the binomial's mean is k q
    if not 0 < q <= 1 or any(abs(p - w) > 1e-9 for p, w in zip(probs, binomial_weights(k, q))):
        raise ValueError("a mixture of Gaussians whose weights are not Binomial(k, q) is not "
                         "an ELS step")
    return k, [(float(event.standard_deviation), q, count)]


def event_epsilon(event: Mapping[str, Any] | Any, delta: float | None,
                  accountant: str = "pld", convention: Mapping[str, Any] | None = None
                  ) -> float:
    """Return epsilon at ``delta`` of a run's event (JSON form or ``DpEvent``) by
    ``accountant`` (results.json's ``accountant``): the reported epsilon, from the event and
    its ``convention`` (results.json's ``mechanism.convention``; None: a record written
    before it, ``legacy_convention``).

    Multipliers relative to 2C (replace-one, ``shuffle``/``fixed_size``) are read as they are:
    sampling without replacement by dp-accounting's RDP accountant under replace-one, the
    only one that has it; an ELS event's mixtures of Gaussians (``els_groups``) by
    ``user_level.els_epsilon``, dp-accounting's PLD of the mixture; a plain Gaussian as a
    Poisson group at q = 1 (``samplers.sampling_epsilon``). Multipliers relative to C under
    replace-one (Poisson) are read by the PLD accountant under replace-one, which doubles the
    sensitivity; under add/remove or zero-out, as they are. A convention inconsistent with
    the event raises."""
    from dp_accounting import dp_event

    from dpbench.privacy.samplers import REPLACE_ONE

    event = from_json(event)
    if _contains(event, dp_event.NonPrivateDpEvent):
        return math.inf
    conv = _checked_convention(event, convention)
    if _contains(event, dp_event.SampledWithoutReplacementDpEvent):
        from dp_accounting.privacy_accountant import NeighboringRelation
        from dp_accounting.rdp import rdp_privacy_accountant as rdp

        rdp_accountant = rdp.RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
        rdp_accountant.compose(event)
        return float(rdp_accountant.get_epsilon(float(delta)))
    els = els_groups(event)
    if els is not None:  # ELS: the mixture of Gaussians, by dp-accounting's PLD only
        from dpbench.privacy.user_level import els_epsilon

        if accountant != "pld" or conv["neighbouring"] == REPLACE_ONE:
            raise ValueError(f"accountant {accountant!r} under {conv['neighbouring']} has no "
                             "analysis of the mixture of Gaussians (ELS); only pld under "
                             "add_remove or zero_out")
        return els_epsilon(els[1], els[0], float(delta))
    groups = _groups(event)
    if groups is None:
        return math.inf
    groups = [g for g in groups if g[2] > 0]
    if not groups:
        return 0.0
    if conv["neighbouring"] == REPLACE_ONE and conv["multiplier_relative_to"] == "C":
        from dpbench.privacy.accountant_pld import canonical_groups
        from dpbench.privacy.accountant_pld import pld_epsilon as grouped_pld

        if accountant != "pld":
            raise ValueError(f"accountant {accountant!r} has no replace-one analysis of these "
                             "events (multipliers relative to C); only pld")
        return grouped_pld(canonical_groups(groups), float(delta), replace=True)
    return compose_epsilon(groups, float(delta), accountant)


def dp_accounting_epsilon(event: Mapping[str, Any] | Any, delta: float,
                          convention: Mapping[str, Any] | None, accountant: str,
                          relation: str, discretization: float = 1e-4) -> float:
    """Return epsilon at ``delta`` of the event by dp-accounting's own ``accountant``
    ("pld" or "rdp") under ``NeighboringRelation.<relation>``, after checking that the pair
    reads events of this ``convention`` correctly (``samplers.check_reading``: a pair that
    would double-count or halve the replace-one factor raises ValueError)."""
    from dp_accounting import privacy_accountant as pa

    from dpbench.privacy.samplers import check_reading

    event = from_json(event)
    check_reading(_checked_convention(event, convention), accountant, relation)
    neighbours = pa.NeighboringRelation[relation]
    if accountant == "pld":
        from dp_accounting.pld import pld_privacy_accountant

        acc: Any = pld_privacy_accountant.PLDAccountant(
            neighboring_relation=neighbours, value_discretization_interval=discretization)
    else:
        from dp_accounting.rdp import rdp_privacy_accountant

        acc = rdp_privacy_accountant.RdpAccountant(neighboring_relation=neighbours)
    acc.compose(event)
    return float(acc.get_epsilon(float(delta)))


def event_pld_epsilon(event: Mapping[str, Any] | Any, delta: float,
                      discretization: float = 1e-4) -> float:
    """Return epsilon at ``delta`` of the event by dp-accounting's generic PLD accountant."""
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant(
        value_discretization_interval=discretization)
    accountant.compose(from_json(event))
    return float(accountant.get_epsilon(delta))
