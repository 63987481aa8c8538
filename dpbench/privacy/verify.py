"""Recompute epsilon from a run's privacy ledger with an independent accountant.

A run accounts with its ``privacy.accountant`` (dpbench's grouped, grid-capped, cached use of
dp-accounting's PLD by default; Opacus's PRV or RDP on request). This module re-derives
epsilon from ``results.json``'s ``privacy_ledger`` along another path: dp-accounting's generic
event-by-event ``PLDAccountant`` on a fixed fine grid (Koskela et al. 2020; Doroshenko et al.
2022), from the raw per-query sensitivities and noise, so a mis-recorded mechanism or an
under-reporting accountant shows up as a mismatch. Each ledger entry is ``steps`` Poisson-
subsampled Gaussian mechanisms at rate q whose queries compose into one Gaussian with
multiplier (sum_k sigma_k^-2)^(-1/2) (ledger.py), recomputed here from the per-query
sensitivity and noise std rather than read from the entry.

Entries of a run whose sampler was not Poisson carry it (``sampling``: sampler, neighbouring
relation, N, B, steps per epoch); they are re-derived from the events ``samplers.dp_event_for``
states for it, with dp-accounting's PLD accountant, or its RDP accountant under replace-one
where the PLD accountant has no such event (``fixed_size``): ``ledger_epsilon``.

``event_epsilon`` re-accounts results.json's ``mechanism.event`` (the run's dp-accounting
``DpEvent``, ``privacy/events.py``) with the run's accountant, from the event alone: it must
equal the reported epsilon; ``event_pld_epsilon`` hands the same event to dp-accounting's own
generic PLD accountant, a second path.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from dpbench.privacy.accountant import compose_epsilon
from dpbench.privacy.events import from_json


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


def ledger_epsilon(ledger: list[Mapping[str, Any]], delta: float) -> float:
    """Return epsilon at ``delta`` re-derived from any run's ledger, its sampler included.

    Poisson entries (no ``sampling``) go to ``pld_epsilon``; a ledger of one other sampler is
    composed from ``dp_event_for``'s events by dp-accounting directly."""
    from dpbench.privacy.samplers import Sampling, dp_event_for, events_relation

    specs = {tuple(sorted(e["sampling"].items())) if e.get("sampling") else None
             for e in ledger}
    if specs == {None} or not ledger:
        return pld_epsilon(ledger, delta)
    if len(specs) != 1:
        raise ValueError("a ledger mixes samplers; each run has one")
    sampling = Sampling(**ledger[0]["sampling"])
    history = [(ledger_noise_multiplier(e), float(e["sample_rate"]), int(e["steps"]))
               for e in ledger]
    if any(s == 0.0 for s, _, k in history if k > 0):
        return math.inf
    history = [(s, q, k) for s, q, k in history if not math.isinf(s)]
    if not history:
        return 0.0
    relation = events_relation(sampling)
    if sampling.sampler == "fixed_size":
        from dp_accounting.rdp import rdp_privacy_accountant as rdp

        accountant = rdp.RdpAccountant(neighboring_relation=relation)
    else:
        from dp_accounting.pld import pld_privacy_accountant

        accountant = pld_privacy_accountant.PLDAccountant(
            neighboring_relation=relation, value_discretization_interval=1e-4)
    accountant.compose(dp_event_for(sampling, history))
    return float(accountant.get_epsilon(delta))


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
