"""The privacy ledger: every privatised query each step released, as it actually ran.

A step releases one or more Gaussian queries on the same Poisson sample (the clipped gradient
sum, and e.g. adaptive clipping's noisy count). Released together on the same batch, Gaussian
queries with per-query multipliers sigma_k = noise_std_k / sensitivity_k compose into one
Gaussian mechanism with multiplier (sum_k sigma_k^-2)^(-1/2) (e.g. Andrew et al. 2021, Thm 1;
Dong, Roth, Su 2019, Cor. 3.3). The loop accounts with that combined multiplier, so a method
cannot under-report by handing the accountant a partial one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


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
