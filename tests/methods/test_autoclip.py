"""AUTO-S (Bu et al. 2023): factor 1 / (||g|| + r), sensitivity 1."""

from __future__ import annotations

import pytest
import torch

from dpbench.errors import ConfigError
from dpbench.methods.autoclip import AUTOCLIP
from dpbench.methods.base import StepContext
from tests.helpers.config import compose_config, run_config

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

CTX = StepContext(step=0, epoch=0, private=True, noise_multiplier=1.0, clip_norm=5.0,
                  expected_batch_size=10.0, sample_rate=0.1, dataset_size=100, total_steps=1)


def test_factors_are_auto_s():
    norms = torch.tensor([0.0, 0.01, 1.0, 1e4])
    factors = AUTOCLIP.configured().halves().mechanism.clip_factors(norms, CTX)
    assert torch.allclose(factors, 1.0 / (norms + 0.01))
    contrib = factors * norms
    assert float(contrib.max()) < AUTOCLIP.configured().halves().mechanism.sensitivity(CTX) == 1.0
    assert contrib[1] == pytest.approx(0.5)  # ||g|| = r: half


def test_runs_in_the_loop_with_sensitivity_one():
    out = run_config(compose_config("method=autoclip", "dataset=digits", "model=logreg",
                                    "trainer.epochs=4", "trainer.batch_size=100",
                                    "trainer.checkpoint=false"))
    (entry,) = out["privacy_ledger"]
    assert entry["queries"][0]["sensitivity"] == 1.0
    assert out["metrics"]["accuracy"] > 0.7  # it learns (chance is 0.1)


def test_bad_stability_rejected():
    from dpbench.experiment import build_trainer

    with pytest.raises(ConfigError, match="stability"):
        build_trainer(compose_config("method=autoclip", "method.settings.stability=0"), None)
