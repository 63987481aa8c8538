"""The gap between the epsilon a run may claim and what other accountings would say.

For a run whose sampler is not Poisson (``samplers.py``): the epsilon the Poisson accountant
would report for the same noise, steps and rate under add/remove (NOT valid for the run: it
assumes batches the run did not draw, and a relation that may not be the run's), and a lower
bound on the epsilon of any valid accounting of the run's sampler under the run's relation
(``shuffle_bound.py``, ``fixed_size_bound.py``). Reported next to the run's valid epsilon in
results.json and ``dpbench-report``, each with the relation it holds under
(docs/sampling.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dpbench.privacy.accountant import epsilon
from dpbench.privacy.fixed_size_bound import fixed_size_lower_bound
from dpbench.privacy.samplers import ADD_REMOVE, Sampling, epoch_noise
from dpbench.privacy.shuffle_bound import left_out_fraction, shuffle_lower_bound

NOT_VALID_NOTE = ("epsilon_if_poisson: what a Poisson accountant would claim for this run's "
                  "noise, rate and steps; NOT valid for this run, whose batches were not "
                  "Poisson-sampled")
LOWER_BOUND_SOURCE = {
    "shuffle": ("Chua et al. 2024, 'How Private are DP-SGD Implementations?', Sec. 4: the "
                "epoch's largest noisy sum, mixed with the left-out examples' (N - T B) / N, "
                "per-epoch pairs composed (dp-accounting PLD, optimistic)"),
    "fixed_size": ("constructive pair: the differing example drawn with probability B / N "
                   "per step, its sum shifted by the relation's sensitivity; composed "
                   "(dp-accounting PLD, optimistic)")}


def epsilon_if_poisson(accountant: str, history: Sequence[tuple[float, float, int]],
                       delta: float) -> float:
    """Return the Poisson accountant's epsilon for ``history`` (add/remove, the same sigma)."""
    return epsilon("pld" if accountant == "prv" else accountant, history, delta) \
        if history else 0.0


def epsilon_if_poisson_under(sampling: Sampling, accountant: str,
                             history: Sequence[tuple[float, float, int]],
                             delta: float) -> float:
    """Return the Poisson epsilon of ``history`` under the run's own relation (NOT valid for
    the run either): the like-for-like figure beside its valid epsilon and lower bound.
    Replace-one: dp-accounting's PLD under ``REPLACE_ONE``; zero-out and add/remove: the
    add/remove figure (the same privacy loss for Poisson)."""
    from dpbench.privacy.samplers import REPLACE_ONE, sampling_epsilon

    if sampling.neighbouring != REPLACE_ONE:
        return epsilon_if_poisson(accountant, history, delta)
    poisson = Sampling("poisson", REPLACE_ONE, sampling.dataset_size, sampling.batch_size,
                       sampling.steps_per_epoch)
    return sampling_epsilon(poisson, "pld", history, delta, epsilon) if history else 0.0


def lower_bound(sampling: Sampling, history: Sequence[tuple[float, float, int]],
                delta: float) -> float | None:
    """Return a lower bound on any valid epsilon of ``history`` under ``sampling`` (its
    relation), or None where none is implemented (``poisson``)."""
    if sampling.poisson or not history:
        return None
    if sampling.sampler == "fixed_size":
        return fixed_size_lower_bound(history, sampling.sensitivity, delta)
    sigmas = epoch_noise(sampling, history)
    left_out = left_out_fraction(sampling.dataset_size, sampling.batch_size,
                                 sampling.steps_per_epoch) if sampling.dataset_size else 0.0
    # the epochs at their largest multiplier: fewer losses, a lower (still valid) bound
    return shuffle_lower_bound(max(sigmas) / sampling.sensitivity, sampling.steps_per_epoch,
                               len(sigmas), delta, left_out=left_out)


def gap_record(sampling: Sampling, accountant: str,
               history: Sequence[tuple[float, float, int]], delta: float) -> dict[str, Any]:
    """Return results.json's sampler fields: the relation always (``neighbouring``, the
    relation of ``epsilon``); for a non-Poisson run also ``epsilon_if_poisson`` (labelled not
    valid, with its relation, add/remove), ``epsilon_if_poisson_same_relation`` (the Poisson
    figure under the run's relation, not valid either) and ``epsilon_lower_bound`` (under the
    run's relation)."""
    out: dict[str, Any] = {"sampler": sampling.sampler, "neighbouring": sampling.neighbouring}
    if sampling.poisson:
        return out
    out["epsilon_if_poisson"] = epsilon_if_poisson(accountant, history, delta)
    out["epsilon_if_poisson_neighbouring"] = ADD_REMOVE
    out["epsilon_if_poisson_note"] = NOT_VALID_NOTE
    # the same figure under the run's own relation, for a like-for-like comparison
    out["epsilon_if_poisson_same_relation"] = epsilon_if_poisson_under(
        sampling, accountant, history, delta)
    out["epsilon_lower_bound"] = lower_bound(sampling, history, delta)
    if out["epsilon_lower_bound"] is not None:
        out["epsilon_lower_bound_neighbouring"] = sampling.neighbouring
        out["epsilon_lower_bound_source"] = LOWER_BOUND_SOURCE[sampling.sampler]
    return out
