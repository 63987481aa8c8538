"""Hand-written results.json records for the readers' tests."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any


def record(method="dpsgd", eps=1.0, seed=0, acc=0.9, **extra):
    return {"method": method, "method_name": method, "dataset": "digits", "model": "mlp",
            "privacy": f"eps{eps:g}", "seed": seed, "target_epsilon": eps, "epsilon": eps * 0.99,
            "status": "completed", "metrics": {"accuracy": acc}, **extra}


def write_record_file(root: Path, name: str, content) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    text = content if isinstance(content, str) else json.dumps(
        with_ledger(content) if isinstance(content, dict) else content)
    (folder / "results.json").write_text(text)
    return folder


@functools.cache
def _ledger_facts() -> tuple[tuple[str, Any], ...]:
    """A small Poisson DP-SGD mechanism and the epsilon its ledger gives (computed once)."""
    from dpbench.privacy.accountant import compose_epsilon

    # a tiny epsilon (0.0034): below every target a test names
    sigma, rate, steps, delta, accountant = 20.0, 0.01, 10, 1e-5, "pld"
    ledger = [{"noise_multiplier": sigma, "sample_rate": rate, "steps": steps,
               "queries": [{"sensitivity": 1.0, "noise_std": sigma}]}]
    return (("privacy_ledger", ledger), ("noise_multiplier", sigma), ("sample_rate", rate),
            ("steps", steps), ("delta", delta), ("accountant", accountant), ("private", True),
            ("epsilon", compose_epsilon([(sigma, rate, steps)], delta, accountant)))


def with_ledger(record: dict[str, Any]) -> dict[str, Any]:
    """Return a hand-written private ``record`` with a ledger the readers re-derive its
    epsilon from (a record without one is tabulated apart: ``results.UNDERIVED_LABEL``);
    records with a ledger, or non-private ones, are returned as they are."""
    import math

    named = [v for v in (record.get("epsilon"), record.get("target_epsilon"))
             if isinstance(v, (int, float)) and not isinstance(v, bool) and v != math.inf]
    if ("privacy_ledger" in record or record.get("private") is False or not named
            or record.get("sampler", "poisson") != "poisson"):
        return record
    return {**record, **dict(_ledger_facts())}
