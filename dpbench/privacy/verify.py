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


def event_epsilon(event: Mapping[str, Any] | Any, delta: float | None,
                  accountant: str = "pld") -> float:
    """Return epsilon at ``delta`` of a run's event (JSON form or ``DpEvent``) by
    ``accountant`` (results.json's ``accountant``): the reported epsilon, from the event alone.

    Sampling without replacement (``trainer.sampler=fixed_size``) is composed by
    dp-accounting's RDP accountant under replace-one, the only one that has it; a plain
    Gaussian (``shuffle``'s epochs, multiplier relative to the replace-one shift) is a
    Poisson group at q = 1 (``samplers.sampling_epsilon``)."""
    from dp_accounting import dp_event

    event = from_json(event)
    if _contains(event, dp_event.NonPrivateDpEvent):
        return math.inf
    if _contains(event, dp_event.SampledWithoutReplacementDpEvent):
        from dp_accounting.privacy_accountant import NeighboringRelation
        from dp_accounting.rdp import rdp_privacy_accountant as rdp

        rdp_accountant = rdp.RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
        rdp_accountant.compose(event)
        return float(rdp_accountant.get_epsilon(float(delta)))
    groups = _groups(event)
    if groups is None:
        return math.inf
    groups = [g for g in groups if g[2] > 0]
    return compose_epsilon(groups, float(delta), accountant) if groups else 0.0


def event_pld_epsilon(event: Mapping[str, Any] | Any, delta: float,
                      discretization: float = 1e-4) -> float:
    """Return epsilon at ``delta`` of the event by dp-accounting's generic PLD accountant."""
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant(
        value_discretization_interval=discretization)
    accountant.compose(from_json(event))
    return float(accountant.get_epsilon(delta))
