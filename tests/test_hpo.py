"""DP-HPO: trial sampling, the search's composed epsilon, selection on the validation split."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch
from opacus.accountants import RDPAccountant
from torch.utils.data import Subset

import dpbench.hpo
from dpbench.config.compose import compose_config
from dpbench.data.base import VALIDATION_SPLIT_SEED, fixed_split, validation_indices
from dpbench.errors import ConfigError, TrainingDiverged
from dpbench.experiment import load_data
from dpbench.hpo import (
    composed_epsilon,
    random_search,
    run_trial,
    sample_trials,
    search_streams,
)
from dpbench.methods.base import DPMethod
from dpbench.privacy import PrivacyAccountant
from dpbench.privacy.composition import compose_ledgers
from dpbench.training.loop import Trainer

#: a tiny private search: digits, logistic regression, one epoch, a fixed sigma
TINY_SEARCH = ["logger=none", "trainer.progress=false", "trainer.checkpoint=false",
               "trainer.device=cpu", "dataset=digits", "model=logreg", "method=dpsgd",
               "trainer.epochs=1", "privacy=sigma", "privacy.noise_multiplier=1.0"]
SAME_B = [{"method.optimizer.lr": 0.5, "trainer.batch_size": 100}] * 2


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
    assert out["search_epsilon"] == pytest.approx(composed_epsilon(
        ledgers, out["search_delta"], out["search_accountant"]))
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


def test_trials_get_distinct_spawned_seeds_apart_from_the_draws():
    draws, seeds = search_streams(7, 50)
    assert len(set(seeds)) == 50 and all(0 <= s < 2**63 for s in seeds)
    assert (draws, seeds) != search_streams(8, 50) and seeds == search_streams(7, 50)[1]
    # the draws are a stream of their own: no trial and not the master seed itself
    assert draws not in seeds and 7 not in seeds and draws != 7


def test_two_trials_draw_independent_noise_and_batches(monkeypatch):
    """Equal batch size, equal lr: the trials' noise is uncorrelated and their batches differ.

    With one shared seed the two trials drew identical noise (correlation 1) and identical
    Poisson batches, so the difference of their releases cancelled the noise.
    """
    noise: list[torch.Tensor] = []
    batches: list[int] = []
    normal, step = torch.normal, Trainer.train_step

    def record_normal(*args, **kwargs):
        out = normal(*args, **kwargs)
        if out.numel() > 1:  # the gradient noise (extra queries are scalars)
            noise.append(out.detach().flatten() / float(args[1]))
        return out

    def record_step(self, batch):
        metrics = step(self, batch)
        batches.append(int(metrics["unprivatised"]["batch_size"]))
        return metrics

    monkeypatch.setattr(torch, "normal", record_normal)
    monkeypatch.setattr(Trainer, "train_step", record_step)
    out = random_search(TINY_SEARCH, SAME_B, "accuracy")
    assert len(set(out["trial_seeds"])) == 2
    steps = len(batches) // 2
    assert steps >= 10 and len(noise) % 2 == 0
    per_trial = len(noise) // 2
    a, b = (torch.cat(noise[:per_trial]), torch.cat(noise[per_trial:]))
    corr = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
    per_step = [float(torch.corrcoef(torch.stack([x, y]))[0, 1])
                for x, y in zip(a.chunk(steps), b.chunk(steps))]
    assert abs(corr) < 0.05, corr
    assert float(np.median(np.abs(per_step))) < 0.1 and max(map(abs, per_step)) < 0.2
    assert batches[:steps] != batches[steps:]  # different Poisson batches at equal B


def test_a_failed_trial_keeps_its_ledger_in_the_search_epsilon(monkeypatch):
    """Trial 1 diverges after k released steps: those k steps are composed into the search."""
    k = 4
    _, seeds = search_streams(0, 2)
    step = Trainer.train_step

    def diverge_after_k(self, batch):
        metrics = step(self, batch)
        if self.seed == seeds[1] and self.step == k:
            raise TrainingDiverged(f"forced divergence after step {k}")
        return metrics

    monkeypatch.setattr(Trainer, "train_step", diverge_after_k)
    out = random_search(TINY_SEARCH, SAME_B, "accuracy", seeds=seeds)
    ok, failed = out["trials"]
    assert "failed" in failed and "forced divergence" in failed["failed"]
    assert sum(e["steps"] for e in failed["privacy_ledger"]) == k
    ledgers = [ok["privacy_ledger"], failed["privacy_ledger"]]
    delta = out["search_delta"]
    assert out["search_epsilon"] == pytest.approx(
        compose_ledgers(ledgers, delta, out["search_accountant"]), rel=1e-9)
    assert out["search_epsilon"] > compose_ledgers(ledgers[:1], delta,
                                                   out["search_accountant"]) * 1.01
    assert out["best"]["trial"] == 0


def test_the_search_composes_through_the_privacy_package():
    ledger = [{"noise_multiplier": 1.1, "sample_rate": 0.01, "steps": 30},
              {"noise_multiplier": 2.0, "sample_rate": 0.02, "steps": 5}]
    acc = PrivacyAccountant("rdp")
    for _ in range(2):
        for entry in ledger:
            for _ in range(entry["steps"]):
                acc.step(noise_multiplier=entry["noise_multiplier"],
                         sample_rate=entry["sample_rate"])
    assert compose_ledgers([ledger, ledger], 1e-5, "rdp") == acc.get_epsilon(1e-5)
    assert compose_ledgers([[], []], 1e-5, "rdp") == 0.0
    source = inspect.getsource(dpbench.hpo)
    assert "opacus" not in source and "create_accountant" not in source


def test_a_fixed_seed_in_the_overrides_is_refused():
    with pytest.raises(ConfigError, match="seed"):
        random_search([*TINY_SEARCH, "seed=3"], SAME_B, "accuracy")


def _origin(dataset) -> tuple[torch.Tensor, list[int]]:
    """Return the base tensors of ``dataset`` and the positions in them that it reads."""
    positions = list(range(len(dataset)))
    while isinstance(dataset, Subset):
        positions = [dataset.indices[i] for i in positions]
        dataset = dataset.dataset
    return dataset.tensors[0], positions


def test_selection_reads_only_validation_and_the_test_split_only_for_the_selected_trial(
        monkeypatch):
    """Every trial is scored on examples carved from the training split; then one evaluation,
    of the selected trial's model, reads the real test split, which no other evaluation read.

    (Scoring each trial on half of the test split, as this search once did, fails the
    assertions on the evaluations made during the search.)
    """
    evaluations = []
    evaluate = DPMethod.evaluate

    def record(self, task, model, loader, device):
        params = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
        evaluations.append((_origin(loader.dataset), params))
        return evaluate(self, task, model, loader, device)

    monkeypatch.setattr(DPMethod, "evaluate", record)
    trials = [{"method.optimizer.lr": lr, "trainer.batch_size": 100} for lr in (0.05, 0.5, 2.0)]
    out = random_search(TINY_SEARCH, trials, "accuracy")

    data = load_data(compose_config(TINY_SEARCH))
    n_train = len(data.train)
    carved_train, carved_val = validation_indices(n_train, 0.15)
    # positions in the whole digits array (fixed_split), to compare the two splits directly
    whole_train, whole_test = fixed_split(n_train + len(data.test), 0.8)
    val_examples = set(whole_train[carved_val].tolist())
    test_examples = set(whole_test.tolist())
    assert val_examples and not val_examples & test_examples

    *during, (after, best_params) = evaluations
    assert len(during) == len(trials)  # one final evaluation per trial, none on the test split
    for (base, positions), _ in during:
        assert torch.equal(base, data.train.tensors[0])
        assert positions == carved_val.tolist()
        assert set(whole_train[positions].tolist()) == val_examples
        assert not set(whole_train[positions].tolist()) & test_examples
    base, positions = after
    assert torch.equal(base, data.test.tensors[0]) and positions == list(range(len(data.test)))

    best = out["best"]
    scores = [r["validation"]["accuracy"] for r in out["trials"]]
    assert best["trial"] == int(np.argmax(scores)) and len(set(scores)) > 1
    # the test evaluation saw the selected trial's trained model, and no other's
    assert torch.equal(best_params, during[best["trial"]][1])
    assert all(not torch.equal(best_params, p) for i, (_, p) in enumerate(during)
               if i != best["trial"])
    assert best["test_size"] == len(data.test) and math.isfinite(best["test"]["accuracy"])
    assert all("test" not in r for r in out["trials"])
    assert out["validation_split"] == {
        "fraction": 0.15, "seed": VALIDATION_SPLIT_SEED, "training_set_size": n_train,
        "validation_size": len(carved_val), "trial_train_size": len(carved_train)}
    assert all("evaluation.split=validation" in r["overrides"] for r in out["trials"])


@pytest.mark.parametrize("override", ["evaluation.split=test", "+evaluation.split=test",
                                      "~evaluation.split", "evaluation={split: test}"])
def test_a_test_split_in_the_overrides_is_refused_before_training(monkeypatch, override):
    def no_training(self):
        raise AssertionError("a trial trained")

    monkeypatch.setattr(Trainer, "fit", no_training)
    with pytest.raises(ConfigError, match="evaluation.split"):
        random_search([*TINY_SEARCH, override], SAME_B, "accuracy")


def test_a_trial_must_be_scored_on_the_validation_split():
    with pytest.raises(ConfigError, match="evaluation.split"):
        run_trial([*TINY_SEARCH, "seed=1"], None)  # evaluation.split defaults to test
