"""The ledger check: a run's ledger matches its steps and noise, and its epsilon matches
dp-accounting's PLD recomputed from the ledger."""

from __future__ import annotations

import functools
import json
import math

import pytest

from dpbench.privacy.verify import event_pld_epsilon, ledger_noise_multiplier, pld_epsilon

#: the run's accountant and this check's PLD are upper bounds discretised differently (the
#: run's pld groups steps and uses a coarser grid; prv is Opacus's); the reported epsilon
#: may sit this much below the check's before we call it under-reported
UNDER_TOLERANCE = 0.01


#: and no more than this factor above it (RDP is looser than PLD)
OVER_FACTOR = {"pld": 1.02, "prv": 1.05, "rdp": 1.5}


@functools.cache
def _pld_of_json(ledger: str, delta: float) -> float:
    return pld_epsilon(json.loads(ledger), delta)


@functools.cache
def _event_pld_of_json(event: str, delta: float) -> float:
    return event_pld_epsilon(json.loads(event), delta)


def ledger_pld_epsilon(ledger: list[dict], delta: float) -> float:
    """``pld_epsilon`` of the ledger, computed once per distinct ledger (a pure function of its
    entries: the many methods whose tiny runs release the same mechanism share the value)."""
    return _pld_of_json(json.dumps(ledger, sort_keys=True), float(delta))


def event_pld(event: dict, delta: float) -> float:
    """``event_pld_epsilon`` of results.json's event, computed once per distinct event."""
    return _event_pld_of_json(json.dumps(event, sort_keys=True), float(delta))


def check_ledger(summary: dict) -> float:
    """Assert the ledger matches the run and its epsilon; return the PLD epsilon."""
    ledger = summary["privacy_ledger"]
    bands = summary.get("participation_bands", 1)  # cyclic Poisson: DP-SGD at b q, T / b steps
    assert sum(e["steps"] for e in ledger) == math.ceil(summary["steps"] / bands)
    for entry in ledger:
        assert entry["sample_rate"] == pytest.approx(bands * summary["sample_rate"], rel=1e-12)
        sigma = ledger_noise_multiplier(entry)
        assert sigma == pytest.approx(entry["noise_multiplier"], rel=1e-9)
        assert sigma >= summary["noise_multiplier"] * (1 - 1e-9)  # never less noise than planned
    eps_pld = ledger_pld_epsilon(ledger, summary["delta"])
    eps = summary["epsilon"]
    assert eps >= eps_pld * (1 - UNDER_TOLERANCE), f"under-reported: {eps} < PLD {eps_pld}"
    assert eps <= eps_pld * OVER_FACTOR[summary["accountant"]] + 0.02, \
        f"epsilon {eps} far above PLD {eps_pld}"
    return eps_pld
