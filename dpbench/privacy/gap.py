"""The gap between the epsilon a run may claim and what other accountings would say.

For a run whose sampler is not Poisson (``samplers.py``): the epsilon the Poisson accountant
would report for the same noise, steps and rate (NOT valid for the run: it assumes batches
the run did not draw), and, where one is computable, a published lower bound on the
epsilon of any valid accounting of the run's sampler (``shuffle_bound.py``). Reported next
to the run's valid epsilon in results.json and ``dpbench-report`` (docs/sampling.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dpbench.privacy.accountant import epsilon
from dpbench.privacy.samplers import Sampling, epoch_noise
from dpbench.privacy.shuffle_bound import shuffle_lower_bound

NOT_VALID_NOTE = ("epsilon_if_poisson: what a Poisson accountant would claim for this run's "
                  "noise, rate and steps; NOT valid for this run, whose batches were not "
                  "Poisson-sampled")
LOWER_BOUND_SOURCE = ("Chua et al. 2024, 'How Private are DP-SGD Implementations?', Sec. 4: "
                      "the epoch's largest noisy sum, per-epoch pairs composed "
                      "(dp-accounting PLD, optimistic)")


def epsilon_if_poisson(accountant: str, history: Sequence[tuple[float, float, int]],
                       delta: float) -> float:
    """Return the Poisson accountant's epsilon for ``history`` (add/remove, the same sigma)."""
    return epsilon("pld" if accountant == "prv" else accountant, history, delta) \
        if history else 0.0


def lower_bound(sampling: Sampling, history: Sequence[tuple[float, float, int]],
                delta: float) -> float | None:
    """Return a lower bound on any valid epsilon of ``history`` under ``sampling``, or None
    where none is implemented (``poisson``, ``fixed_size``)."""
    if sampling.sampler != "shuffle" or not history:
        return None
    sigmas = epoch_noise(sampling, history)
    # the epochs at their largest multiplier: fewer losses, a lower (still valid) bound
    return shuffle_lower_bound(max(sigmas) / sampling.sensitivity, sampling.steps_per_epoch,
                               len(sigmas), delta)


def gap_record(sampling: Sampling, accountant: str,
               history: Sequence[tuple[float, float, int]], delta: float) -> dict[str, Any]:
    """Return results.json's sampler fields: the relation always; for a non-Poisson run also
    ``epsilon_if_poisson`` (labelled not valid) and ``epsilon_lower_bound`` (or None)."""
    out: dict[str, Any] = {"sampler": sampling.sampler, "neighbouring": sampling.neighbouring}
    if sampling.poisson:
        return out
    out["epsilon_if_poisson"] = epsilon_if_poisson(accountant, history, delta)
    out["epsilon_if_poisson_note"] = NOT_VALID_NOTE
    out["epsilon_lower_bound"] = lower_bound(sampling, history, delta)
    if out["epsilon_lower_bound"] is not None:
        out["epsilon_lower_bound_source"] = LOWER_BOUND_SOURCE
    return out
