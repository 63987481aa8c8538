"""A well-formed accounted choice of ``dpbench-tune`` for the choices-file tests."""

from __future__ import annotations

import copy

from dpbench.privacy.composition import compose_ledgers

CELL = ["dataset=digits", "model=logreg", "method=dpsgd", "privacy=eps3", "trainer.epochs=1",
        "trainer.device=cpu"]
# sigma 0.8 at q 0.05 for 20 steps spends 3.38 >= the cell's target 3, as a calibrated trial does
LEDGER = [{"sample_rate": 0.05, "noise_multiplier": 0.8, "queries": [], "steps": 20}]


def accounted_choice(key: str) -> dict:
    """A well-formed accounted choice: two trials, each with its own ledger."""
    trial_eps = compose_ledgers([LEDGER], 1e-5, "pld")
    trials = [{"lr": lr, "seed": i + 1, "score": 0.5, "epsilon": trial_eps, "delta": 1e-5,
               "accountant": "pld", "validation_size": 200, "steps": 20,
               "ledger": copy.deepcopy(LEDGER)} for i, lr in enumerate((0.1, 0.5))]
    total = compose_ledgers([LEDGER * 2], 1e-5, "pld")
    return {"key": key, "mode": "accounted", "select": "accuracy", "grid": [0.1, 0.5],
            "trials": trials, "search_ledger": LEDGER * 2, "selection_epsilon": 3.0,
            "delta": 1e-5, "accountant": "pld", "trials_epsilon": total,
            "search_epsilon": max(total, 3.0), "overrides": {"method.optimizer.lr": 0.5},
            "at_grid_edge": True}
