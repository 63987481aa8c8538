"""Interleaved overhead timing: every step timed, steps holding an evaluation left out."""

from __future__ import annotations

from dpbench.experiment import build_trainer
from dpbench.runners.overhead import StepTimer
from tests.helpers.config import compose_config


def test_step_timer_skips_evaluations_and_reports_a_ratio():
    cfg = compose_config("method=spectral_denoise", "method.settings.targets=all_2d",
                         "dataset=digits", "model=mlp", "trainer.epochs=1",
                         "trainer.batch_size=256", "trainer.eval_every_steps=2",
                         "trainer.checkpoint=false", "privacy=sigma",
                         "privacy.noise_multiplier=1.0", "privacy.accountant=rdp")
    timer = StepTimer()
    result = build_trainer(cfg, None, callbacks=[timer]).fit()
    assert result["steps"] == 5 and len(result["step_history"]) == 2
    assert len(timer.samples) == 3  # steps 1, 2, 4: steps 3 and 5 follow an evaluation
    assert all(0 < post < step for step, post in timer.samples)
    ratio = timer.ratio()
    assert ratio["steps_timed"] == 3 and 0 < ratio["overhead_ratio"]
