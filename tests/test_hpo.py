"""DP-HPO: trial sampling, the search's composed epsilon, held-out selection."""

from __future__ import annotations

import math

import pytest
from opacus.accountants import RDPAccountant

from dpbench.hpo import composed_epsilon, random_search, sample_trials


def test_sample_trials_in_ranges_and_reproducible():
    a = sample_trials(50, 3, (1.0, 10.0), [1024, 4096], [0.0, 0.1])
    assert a == sample_trials(50, 3, (1.0, 10.0), [1024, 4096], [0.0, 0.1])
    assert all(1.0 <= t["method.optimizer.lr"] <= 10.0 for t in a)
    assert {t["trainer.batch_size"] for t in a} == {1024, 4096}
    assert {t["method.settings.clip_floor"] for t in a} == {0.0, 0.1}


def test_composed_epsilon_is_the_composition_of_all_trials():
    ledger = [{"noise_multiplier": 1.1, "sample_rate": 0.01, "steps": 300}]
    ref = RDPAccountant()
    ref.history = [(1.1, 0.01, 600)]
    two = composed_epsilon([ledger, ledger], 1e-5)
    assert two == pytest.approx(ref.get_epsilon(delta=1e-5), rel=1e-9)
    assert two > composed_epsilon([ledger], 1e-5)


def test_random_search_accounts_every_trial():
    base = ["logger=none", "trainer.progress=false", "trainer.checkpoint=false",
            "trainer.device=cpu", "dataset=digits", "model=logreg", "method=bounded_adaclip",
            "trainer.epochs=1", "privacy=sigma", "privacy.noise_multiplier=1.0"]
    trials = sample_trials(2, 0, (0.5, 2.0), [100, 200], [0.0, 0.1])
    out = random_search(base, trials, "worst_class_accuracy")
    ledgers = [r["privacy_ledger"] for r in out["trials"]]
    assert len(ledgers) == 2 and all(ledgers)
    assert out["search_epsilon"] == pytest.approx(composed_epsilon(ledgers, out["search_delta"]))
    assert out["search_epsilon"] > max(out["per_trial_epsilon"])
    best = out["best"]
    assert best["validation"]["worst_class_accuracy"] == max(
        r["validation"]["worst_class_accuracy"] for r in out["trials"])
    assert math.isfinite(best["test"]["accuracy"])


def test_methods_share_lr_and_batch_draws():
    with_floor = sample_trials(10, 5, (1.0, 10.0), [1, 2, 3], [0.0, 0.1])
    without = sample_trials(10, 5, (1.0, 10.0), [1, 2, 3], None)
    strip = [{k: v for k, v in t.items() if k != "method.settings.clip_floor"} for t in with_floor]
    assert strip == without
