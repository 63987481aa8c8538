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


def event_epsilon(event: Mapping[str, Any] | Any, delta: float | None,
                  accountant: str = "pld") -> float:
    """Return epsilon at ``delta`` of a run's event (JSON form or ``DpEvent``) by
    ``accountant`` (results.json's ``accountant``): the reported epsilon, from the event alone."""
    groups = _groups(from_json(event))
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
