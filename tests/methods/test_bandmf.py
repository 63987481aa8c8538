"""BandMF: b = 1 is DP-SGD, cyclic Poisson separation, amplified accounting, resume, refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from opacus.data_loader import DPDataLoader
from torch.utils.data import TensorDataset

from dpbench.errors import ConfigError
from dpbench.experiment import build_trainer
from dpbench.methods.bandmf import BANDMF
from dpbench.privacy.verify import pld_epsilon
from dpbench.training.batch_samplers import (
    CyclicPoissonSampler,
    cyclic_poisson_loader,
    fixed_partitions,
)
from dpbench.training.loop import Callback
from tests.helpers.config import compose_config
from tests.helpers.ledger import check_ledger
from tests.helpers.method_matrix import method_overrides

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

AS_DPSGD = ("method.optimizer.lr=1.0", "method.optimizer.momentum=0.0")


def _indices(loader, epochs: int) -> list[list[int]]:
    return [batch[0].tolist() for _ in range(epochs) for batch in loader]


def test_one_partition_draws_dpsgd_batches():
    data = TensorDataset(torch.arange(500))
    dpsgd = DPDataLoader(data, sample_rate=0.03, generator=torch.Generator().manual_seed(7))
    sampler = CyclicPoissonSampler(fixed_partitions(500, 1, 0), 0.03, len(dpsgd),
                                   torch.Generator().manual_seed(7))
    assert _indices(cyclic_poisson_loader(data, sampler), 3) == _indices(dpsgd, 3)


@pytest.mark.parametrize("bands", [2, 5])
def test_each_example_in_at_most_one_of_any_b_consecutive_batches(bands):
    n, rate = 503, 0.1
    parts = fixed_partitions(n, bands, np.random.SeedSequence(3))
    assert sorted(torch.cat(parts).tolist()) == list(range(n))  # disjoint, covering
    again = fixed_partitions(n, bands, np.random.SeedSequence(3))  # fixed by the seed
    assert all(torch.equal(a, b) for a, b in zip(parts, again))
    sampler = CyclicPoissonSampler(parts, rate, 37, torch.Generator().manual_seed(0))
    batches = [set(b) for _ in range(4) for b in sampler]  # across epoch boundaries too
    for t in range(len(batches)):
        window = batches[t: t + bands]
        for i in range(len(window)):
            for j in range(i + 1, len(window)):
                assert not window[i] & window[j], f"an example twice within {bands} steps"
        assert batches[t] <= set(parts[t % bands].tolist())
    mean = np.mean([len(b) for b in batches])
    assert mean == pytest.approx(rate * n / bands, rel=0.1)  # expected batch B = q N


def test_one_band_equals_dpsgd_trajectory_and_epsilon():
    """Same seed: identical batches, noise, parameters after every step, and epsilon."""
    extra = ("trainer.epochs=2",)
    band = build_trainer(compose_config(*method_overrides("bandmf"), *AS_DPSGD,
                                        "method.settings.bands=1", *extra), None)
    dpsgd = build_trainer(compose_config(*method_overrides("dpsgd"), *extra), None)
    assert band.plan == dpsgd.plan
    got, want = band.fit(), dpsgd.fit()
    assert got["steps"] == want["steps"] > band.plan.steps_per_epoch
    for a, b in zip(band.model.parameters(), dpsgd.model.parameters()):
        assert torch.equal(a, b)
    assert got["epsilon"] == want["epsilon"]
    assert got["privacy_ledger"] == want["privacy_ledger"]


def test_banded_run_is_accounted_as_amplified_dpsgd(tmp_path):
    trainer = build_trainer(compose_config(*method_overrides("bandmf"),
                                           "method.settings.bands=4"), None)
    summary = trainer.fit()
    q, steps, b = summary["sample_rate"], summary["steps"], 4
    assert summary["participation_bands"] == b
    ledger = summary["privacy_ledger"]
    assert sum(e["steps"] for e in ledger) == math.ceil(steps / b)
    assert all(e["sample_rate"] == pytest.approx(b * q) for e in ledger)
    eps_pld = check_ledger(summary)  # the independent dp-accounting PLD recomputation
    equivalent = [{"sample_rate": b * q, "steps": math.ceil(steps / b), "queries": [
        {"sensitivity": 1.0, "noise_std": summary["noise_multiplier"]}]}]
    assert eps_pld == pytest.approx(pld_epsilon(equivalent, summary["delta"]), rel=1e-9)
    assert summary["epsilon"] <= summary["target_epsilon"] * 1.01
    eq = summary["method_summary"]["equivalent_dpsgd"]
    assert eq == {"noise_multiplier": summary["noise_multiplier"], "sample_rate": b * q,
                  "steps": math.ceil(steps / b)}
    # at the same target, amplification by b buys less noise than b x the steps would need
    dpsgd = build_trainer(compose_config(*method_overrides("dpsgd")), None)
    assert summary["noise_multiplier"] > dpsgd.plan.noise_multiplier


def test_released_noise_is_the_banded_recursion():
    """The released gradient minus the clipped sum is sigma S (C^{-1} z)_t / B."""
    trainer = build_trainer(compose_config(*method_overrides("bandmf"),
                                           "method.settings.bands=3"), None)
    shaper = trainer.noise_shaper
    z = [torch.randn(4) for _ in range(5)]
    w = [shaper([zt])[0] for zt in z]
    c = trainer.mechanism.coefs
    assert torch.allclose(w[0], z[0] / c[0])
    assert torch.allclose(w[3], (z[3] - c[1] * w[2] - c[2] * w[1]) / c[0], atol=1e-6)


class _Crash(Callback):
    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def on_step_end(self, trainer, metrics):
        if trainer.step == self.at_step:
            raise KeyboardInterrupt("simulated kill")


def test_resume_continues_sampler_and_noise_state(tmp_path):
    overrides = [*method_overrides("bandmf"), "method.settings.bands=3", "trainer.epochs=3",
                 "trainer.checkpoint=true"]
    full = build_trainer(compose_config(*overrides), tmp_path / "full")
    reference = full.fit()
    spe = full.plan.steps_per_epoch
    assert spe % 3  # epochs end mid-cycle: the partition index must survive the resume
    crashed = build_trainer(compose_config(*overrides), tmp_path / "crashed",
                            [_Crash(at_step=spe + 2)])
    with pytest.raises(KeyboardInterrupt):
        crashed.fit()
    resumed = build_trainer(compose_config(*overrides, "trainer.resume=true"),
                            tmp_path / "crashed")
    summary = resumed.fit()
    assert summary["epsilon"] == reference["epsilon"]
    assert summary["privacy_ledger"] == reference["privacy_ledger"]
    for a, b in zip(resumed.model.parameters(), full.model.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize(("override", "key"), [
    ("method.settings.bands=0", "method.settings.bands"),
    ("method.settings.strategy=dense", "method.settings.strategy"),
    ("method.settings.bands=1000", "method.settings.bands"),  # b > T and b B > N
])
def test_bad_settings_refused_before_training(override, key):
    with pytest.raises(ConfigError, match=key):
        build_trainer(compose_config(*method_overrides("bandmf"), override), None)


def test_noise_history_that_does_not_fit_is_refused(monkeypatch):
    monkeypatch.setattr("dpbench.methods.bandmf.available_memory_bytes", lambda device: 1000)
    with pytest.raises(ConfigError, match="lower bands"):
        build_trainer(compose_config(*method_overrides("bandmf")), None)


def test_settings_defaults_come_from_the_dataclass():
    method = BANDMF.configured().halves()
    assert method.mechanism.settings.bands == BANDMF.settings.bands >= 1
    assert method.mechanism.settings.strategy == "optimal"
