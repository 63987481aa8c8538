"""Epsilon of several runs' ledgers composed: a hyper-parameter search spends all of them.

K runs on the same private data, each adaptively chosen after the previous ones, compose
(adaptive composition; Dwork and Roth 2014, Thm 3.20, and in the accountants' own terms,
Mironov 2017, Prop. 1 for RDP). Every ledger entry, concatenated, goes to the accountant's
``compose_epsilon``: the epsilon of the whole sequence, with the same accountant the runs
used.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dpbench.errors import ConfigError
from dpbench.privacy.accountant import compose_epsilon
from dpbench.privacy.samplers import Sampling, epoch_noise


def compose_ledgers(ledgers: Iterable[Iterable[Mapping[str, Any]]], delta: float,
                    accountant: str) -> float:
    """Return epsilon at ``delta`` of running every ledger's steps one after the other.

    A ledger is a run's ``privacy_ledger`` (entries with ``noise_multiplier``,
    ``sample_rate`` and ``steps``); an empty one (a run that released nothing) adds nothing.
    A shuffled run's ledger (its entries carry ``sampling``, docs/sampling.md) adds its
    epochs' Gaussians (rate 1, sigma over the relation's sensitivity); a fixed-size run's,
    accounted by dp-accounting's RDP events only, is refused.
    """
    history: list[tuple[float, float, int]] = []
    for ledger in ledgers:
        entries = [e for e in ledger if int(e["steps"]) > 0]
        run = [(float(e["noise_multiplier"]), float(e["sample_rate"]), int(e["steps"]))
               for e in entries]
        spec = next((e["sampling"] for e in entries if e.get("sampling")), None)
        if spec is None:
            history += run
            continue
        sampling = Sampling(**spec)
        if sampling.sampler != "shuffle":
            raise ConfigError(f"trainer.sampler={sampling.sampler}: runs of this sampler "
                              "cannot be composed into a search's epsilon (its accountant is "
                              "dp-accounting's RDP on its own events); use poisson or shuffle")
        history += [(s / sampling.sensitivity, 1.0, 1) for s in epoch_noise(sampling, run)]
    return compose_epsilon(history, delta, accountant) if history else 0.0
