"""Bounded adaptive clipping (Zhao et al. 2025): the floor, and C_LB = 0 is adaclip."""

from __future__ import annotations

import pytest

from dpbench.errors import ConfigError
from dpbench.experiment import build_trainer
from tests.helpers.config import compose_config

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

# a large eta_C makes C_t move fast, so a floor at the unbounded run's median binds
SHRINK = ["dataset=digits", "model=logreg", "trainer.epochs=2", "trainer.batch_size=100",
          "trainer.checkpoint=false", "privacy=sigma", "privacy.noise_multiplier=1.0",
          "method.settings.clip_lr=1.0"]


def _trajectory(*overrides: str) -> list[float]:
    trainer = build_trainer(compose_config(*SHRINK, *overrides), None)
    trainer.fit()
    return (trainer.halves.summary()["clip_threshold_trajectory"]
            + [trainer.mechanism.threshold])


def test_floor_always_holds_and_is_reached():
    unbounded = _trajectory("method=adaclip")
    floor = sorted(unbounded)[len(unbounded) // 2]  # half the unbounded thresholds are below
    assert min(unbounded) < 0.9 * floor
    bounded = _trajectory("method=bounded_adaclip", f"method.settings.clip_floor={floor}")
    assert min(bounded) >= floor
    assert sum(c == floor for c in bounded) >= 3  # the floor binds (else the test is empty)


def test_zero_floor_equals_unbounded_on_the_same_noise():
    bounded = _trajectory("method=bounded_adaclip", "method.settings.clip_floor=0.0")
    unbounded = _trajectory("method=adaclip")
    assert len(bounded) == len(unbounded) > 10
    assert bounded == unbounded  # bit-identical: same sampler and noise streams


def test_negative_floor_rejected():
    with pytest.raises(ConfigError, match="clip_floor"):
        build_trainer(compose_config(*SHRINK, "method=bounded_adaclip",
                                     "method.settings.clip_floor=-1"), None)


def test_same_seed_gives_the_same_initial_model():
    """Runs are comparable across methods only if the seed fixes the model's initialisation."""
    import torch

    a = build_trainer(compose_config(*SHRINK, "method=adaclip"), None)
    torch.rand(100)  # whatever ran before must not matter
    b = build_trainer(compose_config(*SHRINK, "method=bounded_adaclip"), None)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)
