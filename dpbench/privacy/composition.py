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

from dpbench.privacy.accountant import compose_epsilon


def compose_ledgers(ledgers: Iterable[Iterable[Mapping[str, Any]]], delta: float,
                    accountant: str) -> float:
    """Return epsilon at ``delta`` of running every ledger's steps one after the other.

    A ledger is a run's ``privacy_ledger`` (entries with ``noise_multiplier``,
    ``sample_rate`` and ``steps``); an empty one (a run that released nothing) adds nothing.
    """
    history = [(float(e["noise_multiplier"]), float(e["sample_rate"]), int(e["steps"]))
               for ledger in ledgers for e in ledger if int(e["steps"]) > 0]
    return compose_epsilon(history, delta, accountant) if history else 0.0
