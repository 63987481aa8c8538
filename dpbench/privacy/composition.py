"""Epsilon of several runs' ledgers composed: a hyper-parameter search spends all of them.

K runs on the same private data, each adaptively chosen after the previous ones, compose
(adaptive composition; Dwork and Roth 2014, Thm 3.20, and in the accountants' own terms,
Mironov 2017, Prop. 1 for RDP). Replaying every ledger entry into one ``PrivacyAccountant``
gives the epsilon of the whole sequence, with the same accountant the runs used.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dpbench.privacy.accountant import PrivacyAccountant


def compose_ledgers(ledgers: Iterable[Iterable[Mapping[str, Any]]], delta: float,
                    accountant: str) -> float:
    """Return epsilon at ``delta`` of running every ledger's steps one after the other.

    A ledger is a run's ``privacy_ledger`` (entries with ``noise_multiplier``,
    ``sample_rate`` and ``steps``); an empty one (a run that released nothing) adds nothing.
    """
    acc = PrivacyAccountant(accountant)
    released = False
    for ledger in ledgers:
        for entry in ledger:
            for _ in range(int(entry["steps"])):
                acc.step(noise_multiplier=float(entry["noise_multiplier"]),
                         sample_rate=float(entry["sample_rate"]))
                released = True
    return acc.get_epsilon(delta) if released else 0.0
