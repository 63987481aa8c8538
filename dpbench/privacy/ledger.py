"""The privacy ledger: every privatised query each step released, as it actually ran, and
the same as a dp-accounting ``DpEvent``.

A step releases one or more Gaussian queries on the same Poisson sample (the clipped gradient
sum, and e.g. adaptive clipping's noisy count). Released together on the same batch, Gaussian
queries with per-query multipliers sigma_k = noise_std_k / sensitivity_k compose into one
Gaussian mechanism with multiplier (sum_k sigma_k^-2)^(-1/2) (e.g. Andrew et al. 2021, Thm 1;
Dong, Roth, Su 2019, Cor. 3.3). The loop accounts with that combined multiplier, so a method
cannot under-report by handing the accountant a partial one.

results.json's ``mechanism`` records the ledger as a dp-accounting event (``run_event``): each
entry is ``steps`` self-composed ``PoissonSampledDpEvent(q, Gaussian)`` steps, the Gaussian
the one the step's queries compose into (dp-accounting samples a single Gaussian only), the
per-query values staying in ``privacy_ledger``. ``sampling`` names how examples were drawn:

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
it. A new sampling kind adds its case to ``run_event`` (the one builder). dp-accounting is
imported where an event is built, so that importing the ledger stays light.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dp_accounting import dp_event


@dataclass(frozen=True)
class Query:
    """One privatised query of a step: name, L2 sensitivity, and the Gaussian noise std added."""

    name: str
    sensitivity: float
    noise_std: float

    @property
    def noise_multiplier(self) -> float:
        return self.noise_std / self.sensitivity if self.sensitivity > 0 else math.inf


def combined_noise_multiplier(queries: list[Query]) -> float:
    """Return (sum_k sigma_k^-2)^(-1/2): the one-Gaussian equivalent of the step's releases."""
    inv = sum(q.noise_multiplier**-2 for q in queries if q.noise_multiplier > 0)
    return inv**-0.5 if inv > 0 else 0.0


@dataclass
class LedgerEntry:
    """A run of identical steps: the same queries at the same sample rate."""

    sample_rate: float
    noise_multiplier: float
    queries: list[dict[str, Any]]
    steps: int = 0
    #: the sampler the steps ran under, when not Poisson (``samplers.Sampling.to_json``:
    #: sampler, neighbouring relation, N, B, steps per epoch), so epsilon can be re-derived
    sampling: dict[str, Any] | None = None


@dataclass
class PrivacyLedger:
    """Compressed per-step record; ``to_json`` goes into results.json as ``privacy_ledger``."""

    entries: list[LedgerEntry] = field(default_factory=list)

    def record(self, sample_rate: float, queries: list[Query],
               sampling: dict[str, Any] | None = None) -> float:
        """Enter one step's queries; return the combined noise multiplier to account.

        ``sampling``: the run's sampler when it is not Poisson (kept in the entry)."""
        sigma = combined_noise_multiplier(queries)
        qs = [
            {"name": q.name, "sensitivity": q.sensitivity, "noise_std": q.noise_std,
             "noise_multiplier": q.noise_multiplier}
            for q in queries
        ]
        last = self.entries[-1] if self.entries else None
        same = (
            last is not None
            and last.sample_rate == sample_rate
            and math.isclose(last.noise_multiplier, sigma, rel_tol=1e-9)
            and [q["name"] for q in last.queries] == [q["name"] for q in qs]
            and last.sampling == sampling
        )
        if same:
            last.steps += 1
        else:
            self.entries.append(LedgerEntry(sample_rate, sigma, qs, 1, sampling))
        return sigma

    @property
    def steps(self) -> int:
        return sum(e.steps for e in self.entries)

    def to_json(self) -> list[dict[str, Any]]:
        """Entries as dicts; ``sampling`` only where set (Poisson entries are as before)."""
        return [{k: v for k, v in asdict(e).items() if k != "sampling" or v is not None}
                for e in self.entries]

    def state_dict(self) -> dict[str, Any]:
        return {"entries": self.to_json()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entries = [LedgerEntry(**e) for e in state["entries"]]


# ---- the ledger as a dp-accounting event ----------------------------------------------

#: how a run samples its examples (``run_event``'s kinds)
SAMPLINGS = ("poisson", "cyclic_poisson", "fixed_size", "shuffle")
#: the key naming an event's class in its JSON form
KIND = "dp_event"


def _step_event(queries: Iterable[Mapping[str, Any]]) -> dp_event.DpEvent:
    """Return the one Gaussian event of a step's queries on the same sample."""
    from dp_accounting import dp_event

    inv = 0.0
    for q in queries:
        if q["sensitivity"] <= 0:
            continue  # a query of sensitivity 0 reveals nothing
        if q["noise_std"] <= 0:
            return dp_event.NonPrivateDpEvent()
        inv += (q["noise_std"] / q["sensitivity"]) ** -2  # as combined_noise_multiplier
    return dp_event.GaussianDpEvent(inv**-0.5) if inv > 0 else dp_event.NoOpDpEvent()


def run_event(ledger: Iterable[Mapping[str, Any]], private: bool = True,
              sampling: str = "poisson") -> dp_event.DpEvent:
    """Return the event of a run from its ledger entries (results.json's ``privacy_ledger``).

    ``sampling`` (``SAMPLINGS``): ``cyclic_poisson`` ledgers already hold one entry step per
    cycle at rate b q (``privacy.plan.account_release``), so both kinds build the same tree.
    """
    from dp_accounting import dp_event

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
    from dp_accounting import dp_event

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
    import attr
    from dp_accounting import dp_event

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
    from dp_accounting import dp_event

    if isinstance(data, Mapping) and KIND in data:
        cls = getattr(dp_event, str(data[KIND]), None)
        if not (isinstance(cls, type) and issubclass(cls, dp_event.DpEvent)):
            raise ValueError(f"not a dp_accounting event: {data[KIND]!r}")
        return cls(**{k: from_json(v) for k, v in data.items() if k != KIND})
    if isinstance(data, list):
        return [from_json(d) for d in data]
    return data
