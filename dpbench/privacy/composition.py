"""Epsilon of several runs' ledgers composed: a hyper-parameter search spends all of them.

K runs on the same private data, each adaptively chosen after the previous ones, compose
(adaptive composition; Dwork and Roth 2014, Thm 3.20, and in the accountants' own terms,
Mironov 2017, Prop. 1 for RDP). Every ledger entry, concatenated, goes to the accountant:
the epsilon of the whole sequence, with the same accountant the runs used, under one
neighbouring relation.

Relations (docs/sampling.md): ledgers under one relation compose as they are. Ledgers under
different relations are composed under the strongest of them (replace-one over zero-out over
add/remove), each converted soundly: a Poisson run's steps (multiplier sigma relative to C)
are analysed by dp-accounting's PLD under replace-one (its ``REPLACE``, which takes the
sensitivity 2C itself), a shuffled run's epochs likewise as Gaussians at sigma relative to C;
an add/remove Poisson ledger is valid under zero-out with the same numbers (the zero-out
pair's sums are the add/remove pair's). A combination no offered accountant can convert is
refused in one line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dpbench.errors import ConfigError
from dpbench.privacy.accountant import compose_epsilon
from dpbench.privacy.samplers import (
    ADD_REMOVE,
    RELATION_LABEL,
    REPLACE_ONE,
    ZERO_OUT,
    Sampling,
    epoch_noise,
)

#: the relation a mixed composition is stated under: the strongest one present
_STRENGTH = (ADD_REMOVE, ZERO_OUT, REPLACE_ONE)


def composed_relation(ledgers: Iterable[Iterable[Mapping[str, Any]]]) -> str:
    """Return the relation ``compose_ledgers`` states its epsilon under for ``ledgers``."""
    relations = {ledger_sampling(list(ledger)).neighbouring for ledger in ledgers}
    return max(relations or {ADD_REMOVE}, key=_STRENGTH.index)


def ledger_sampling(ledger: list[Mapping[str, Any]]) -> Sampling:
    """Return the sampler a run's ledger ran under (Poisson under add/remove: no field)."""
    spec = next((e["sampling"] for e in ledger if e.get("sampling")), None)
    return Sampling(**spec) if spec else Sampling()


def compose_ledgers(ledgers: Iterable[Iterable[Mapping[str, Any]]], delta: float,
                    accountant: str) -> float:
    """Return epsilon at ``delta`` of running every ledger's steps one after the other,
    under ``composed_relation(ledgers)``.

    A ledger is a run's ``privacy_ledger`` (entries with ``noise_multiplier``,
    ``sample_rate`` and ``steps``); an empty one (a run that released nothing) adds nothing.
    A shuffled run's ledger (its entries carry ``sampling``, docs/sampling.md) adds its
    epochs' Gaussians (rate 1); a fixed-size run's, accounted by dp-accounting's RDP events
    only, is refused. Under one relation the runs compose as their accountant reads them;
    mixed relations are composed under the strongest (module docstring), which for a
    Poisson run under replace-one only ``pld`` can analyse (others are refused).
    """
    runs: list[tuple[Sampling, list[tuple[float, float, int]]]] = []
    for ledger in ledgers:
        entries = [e for e in ledger if int(e["steps"]) > 0]
        sampling = ledger_sampling(entries)
        if sampling.sampler == "fixed_size":
            raise ConfigError(f"trainer.sampler={sampling.sampler}: runs of this sampler "
                              "cannot be composed into a search's epsilon (its accountant is "
                              "dp-accounting's RDP on its own events); use poisson or shuffle")
        runs.append((sampling, [(float(e["noise_multiplier"]), float(e["sample_rate"]),
                                 int(e["steps"])) for e in entries]))
    runs = [(s, run) for s, run in runs if run]
    if not runs:
        return 0.0
    relation = max((s.neighbouring for s, _ in runs), key=_STRENGTH.index)
    poisson_replace = relation == REPLACE_ONE and any(s.poisson for s, _ in runs)
    if not poisson_replace:
        # one reading for all: Poisson steps as they are (add/remove and zero-out have the
        # same privacy loss), a shuffled run's epochs at sigma over its relation's shift
        history: list[tuple[float, float, int]] = []
        for sampling, run in runs:
            if sampling.poisson:
                history += run
            else:
                shift = 2.0 if relation == REPLACE_ONE else sampling.sensitivity
                history += [(s / shift, 1.0, 1) for s in epoch_noise(sampling, run)]
        return compose_epsilon(history, delta, accountant)
    if accountant != "pld":
        mixed = ", ".join(sorted({f"{s.sampler} under {RELATION_LABEL[s.neighbouring]}"
                                  for s, _ in runs}))
        raise ConfigError(f"privacy.accountant={accountant} cannot compose these runs ({mixed}) "
                          "under replace-one: only pld analyses Poisson steps under "
                          "replace-one; use privacy.accountant=pld")
    from dpbench.privacy.accountant_pld import canonical_groups, pld_epsilon

    # every multiplier relative to C, read by dp-accounting's PLD under replace-one (2C)
    groups: list[tuple[float, float, int]] = []
    for sampling, run in runs:
        groups += run if sampling.poisson else [(s, 1.0, 1) for s in epoch_noise(sampling, run)]
    return pld_epsilon(canonical_groups(groups), float(delta), replace=True)
