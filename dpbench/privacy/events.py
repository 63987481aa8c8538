"""The mechanism a run released, as a dp-accounting ``DpEvent``, and its JSON form.

results.json's ``mechanism`` records what every step released as a dp-accounting event
(``dp_accounting.dp_event``): each ledger entry is ``steps`` self-composed
``PoissonSampledDpEvent(q, Gaussian)`` steps; a step releasing several Gaussian queries on the
same sample (e.g. adaptive clipping's gradient and noisy count) is the one Gaussian they
compose into, multiplier (sum_k sigma_k^-2)^(-1/2) (ledger.py; dp-accounting samples a single
Gaussian only), the per-query values staying in ``privacy_ledger``. ``sampling`` names how
examples were drawn:

- ``poisson``: every step a Poisson sample at rate q (Abadi et al. 2016).
- ``cyclic_poisson``: b fixed partitions, step t a Poisson sample of partition t mod b at
  rate b q (BandMF's b-min-sep participation, Choquette-Choo et al. 2023, Thm 4). Its
  amplification is accounted as DP-SGD at rate b q for ceil(T / b) steps, one step per cycle:
  the event records exactly that composition (dp-accounting has no event of its own for
  b-min-sep participation), and ``sampling`` / ``bands`` say it was amplified.
- ``fixed_size`` and ``shuffle`` (``trainer.sampler``): the events ``samplers.dp_event_for``
  states for them under replace-one (a ``SampledWithoutReplacementDpEvent`` per step; one
  unamplified Gaussian per epoch), built from the sampler that the ledger's entries carry.

``to_json`` / ``from_json`` turn any event (attrs classes of ``dp_accounting.dp_event``) into a
JSON-able dict holding its class name and fields and back; ``privacy/verify.py`` re-accounts
it. A new sampling kind adds its case to ``run_event`` (the one builder).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import attr
from dp_accounting import dp_event

#: how a run samples its examples (``run_event``'s kinds)
SAMPLINGS = ("poisson", "cyclic_poisson", "fixed_size", "shuffle")
#: the key naming an event's class in its JSON form
KIND = "dp_event"


def _step_event(queries: Iterable[Mapping[str, Any]]) -> dp_event.DpEvent:
    """Return the one Gaussian event of a step's queries on the same sample."""
    inv = 0.0
    for q in queries:
        if q["sensitivity"] <= 0:
            continue  # a query of sensitivity 0 reveals nothing
        if q["noise_std"] <= 0:
            return dp_event.NonPrivateDpEvent()
        inv += (q["noise_std"] / q["sensitivity"]) ** -2  # as ledger.combined_noise_multiplier
    return dp_event.GaussianDpEvent(inv**-0.5) if inv > 0 else dp_event.NoOpDpEvent()


def run_event(ledger: Iterable[Mapping[str, Any]], private: bool = True,
              sampling: str = "poisson") -> dp_event.DpEvent:
    """Return the event of a run from its ledger entries (results.json's ``privacy_ledger``).

    ``sampling`` (``SAMPLINGS``): ``cyclic_poisson`` ledgers already hold one entry step per
    cycle at rate b q (``privacy.plan.account_release``), so both kinds build the same tree.
    """
    if not private:
        return dp_event.NonPrivateDpEvent()
    if sampling not in SAMPLINGS:
        raise ValueError(f"unknown sampling {sampling!r}; one of {SAMPLINGS}")
    ledger = list(ledger)
    if sampling in ("fixed_size", "shuffle"):
        return _sampler_event(ledger)
    parts = [dp_event.SelfComposedDpEvent(
                 dp_event.PoissonSampledDpEvent(float(e["sample_rate"]),
                                                _step_event(e["queries"])),
                 int(e["steps"]))
             for e in ledger if int(e["steps"]) > 0]
    return dp_event.ComposedDpEvent(parts)


def _sampler_event(ledger: list[Mapping[str, Any]]) -> dp_event.DpEvent:
    """Return the event of a ledger whose entries carry a non-Poisson sampler."""
    from dpbench.privacy.samplers import Sampling, dp_event_for

    specs = [e.get("sampling") for e in ledger if int(e["steps"]) > 0]
    if not specs:
        return dp_event.ComposedDpEvent([])
    if any(spec is None or spec != specs[0] for spec in specs):
        raise ValueError("a ledger of a non-Poisson run must name one sampler in every entry")
    history = []
    for e in ledger:
        step = _step_event(e["queries"])
        if isinstance(step, dp_event.NonPrivateDpEvent):
            return step
        if isinstance(step, dp_event.GaussianDpEvent) and int(e["steps"]) > 0:
            history.append((float(step.noise_multiplier), float(e["sample_rate"]),
                            int(e["steps"])))
    return dp_event_for(Sampling(**specs[0]), history)


def to_json(event: Any) -> Any:
    """Return ``event`` as JSON-able data: ``{"dp_event": class name, field: value, ...}``."""
    if isinstance(event, dp_event.DpEvent):
        return {KIND: type(event).__name__,
                **{f.name: to_json(getattr(event, f.name)) for f in attr.fields(type(event))}}
    if isinstance(event, (list, tuple)):
        return [to_json(e) for e in event]
    if isinstance(event, float) and not math.isfinite(event):
        return str(event)
    return event


def from_json(data: Any) -> Any:
    """Return the event ``to_json`` wrote (a class outside ``dp_accounting.dp_event`` raises)."""
    if isinstance(data, Mapping) and KIND in data:
        cls = getattr(dp_event, str(data[KIND]), None)
        if not (isinstance(cls, type) and issubclass(cls, dp_event.DpEvent)):
            raise ValueError(f"not a dp_accounting event: {data[KIND]!r}")
        return cls(**{k: from_json(v) for k, v in data.items() if k != KIND})
    if isinstance(data, list):
        return [from_json(d) for d in data]
    return data
