"""DP-IVON-Gradsq: unbiased noise-corrected curvature, projection diagnostics, privacy = DP-SGD."""

from __future__ import annotations

import pytest
import torch

from dpbench.methods import get_method
from dpbench.methods.base import RunInfo, StepContext
from dpbench.methods.ivon import IVONOptimizer, noise_corrected_square
from tests.helpers.config import compose_config, run_config

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick


def test_noise_corrected_square_is_unbiased_for_the_clean_square():
    gen = torch.Generator().manual_seed(0)
    clean = torch.tensor([0.0, 0.05, 0.2, -0.5, 1.0])
    noise_std, draws = 0.3, 200_000
    noisy = clean + noise_std * torch.randn(draws, clean.numel(), generator=gen)
    corrected = noise_corrected_square(noisy, noise_std ** 2).mean(0)
    # Var(g^2) = 4 g0^2 s^2 + 2 s^4: standard error of the mean, 5 se tolerance
    se = ((4 * clean ** 2 * noise_std ** 2 + 2 * noise_std ** 4) / draws).sqrt()
    assert ((corrected - clean ** 2).abs() <= 5 * se).all()
    # the uncorrected square is off by sigma_w^2 = 0.09, far beyond that tolerance
    assert ((noisy.square().mean(0) - clean ** 2 - noise_std ** 2).abs() <= 5 * se).all()
    assert (noise_std ** 2 > 20 * se).all()


def _method(noise_std: float, **settings):
    method = get_method("dp_ivon").configured(
        optimizer=lambda p: IVONOptimizer(p, ess=100.0), **settings).halves()
    param = torch.nn.Parameter(torch.zeros(20_000))
    info = RunInfo(dataset_size=100, expected_batch_size=10, sample_rate=0.1, total_steps=1,
                   noise_multiplier=1.0, clip_norm=1.0, private=True, task="classification",
                   device=torch.device("cpu"))
    method.mechanism.validate(info)
    method.setup([param], info)
    ctx = StepContext(step=0, epoch=0, private=True, noise_multiplier=1.0, clip_norm=1.0,
                      expected_batch_size=10, sample_rate=0.1, dataset_size=100,
                      total_steps=1,
                      noise_std=noise_std)
    return method, ctx


def test_curvature_reads_the_loop_noise_and_projects_to_zero():
    noise_std = 0.1
    method, ctx = _method(noise_std)
    gen = torch.Generator().manual_seed(1)
    g_dp = noise_std * torch.randn(20_000, generator=gen)  # clean gradient 0: pure noise
    (f,) = method.update.curvature([g_dp], ctx)
    zero = method.step_metrics()["vhat_zero_fraction"]
    assert abs(zero - 0.6827) < 0.01  # P(|Z| < 1) for Z ~ N(0, 1)
    expected = 100.0 * (g_dp.square() - noise_std ** 2).clamp(min=0)  # f = N v_hat
    torch.testing.assert_close(f, expected)
    off, ctx_off = _method(noise_std, correction=False)
    (f_off,) = off.update.curvature([g_dp], ctx_off)
    torch.testing.assert_close(f_off, 100.0 * g_dp.square())
    assert off.step_metrics()["vhat_zero_fraction"] == 0.0


def test_dp_ivon_costs_exactly_what_dpsgd_costs(tmp_path):
    common = ["dataset=digits", "model=logreg", "trainer.epochs=1", "trainer.batch_size=128",
              "privacy=eps3", "trainer.checkpoint=false"]
    ivon = run_config(compose_config("method=dp_ivon", "method.settings.mc_samples=2",
                                     "method.settings.eval_samples=2", *common))
    sgd = run_config(compose_config("method=dpsgd", *common))
    assert ivon["private"] and ivon["noise_multiplier"] == sgd["noise_multiplier"]
    assert ivon["epsilon"] == pytest.approx(sgd["epsilon"], rel=1e-12)
    assert ivon["privacy_ledger"] == sgd["privacy_ledger"]
    assert ivon["epsilon"] <= 3.0 + 1e-6
    assert 0.0 <= ivon["metrics"]["vhat_zero_fraction"] <= 1.0
    for key in ("nll", "ece", "brier"):  # the baselines report the same calibration metrics
        assert key in sgd["metrics"] and key in ivon["metrics"]


class _StopAfterFirstEpoch:
    def on_run_start(self, trainer): ...
    def on_step_end(self, trainer, metrics): ...
    def on_run_end(self, trainer, result): ...

    def on_epoch_end(self, trainer, metrics):
        raise KeyboardInterrupt  # after the epoch's checkpoint was written


def test_resumed_run_equals_uninterrupted_run(tmp_path):
    from dpbench.experiment import build_trainer

    args = ["method=dp_ivon", "dataset=digits", "model=logreg", "trainer.epochs=2",
            "trainer.batch_size=512", "method.settings.eval_samples=1", "trainer.resume=true"]
    straight = build_trainer(compose_config(*args), tmp_path / "a")
    straight.fit()
    interrupted = build_trainer(compose_config(*args), tmp_path / "b",
                                callbacks=[_StopAfterFirstEpoch()])
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit()
    resumed = build_trainer(compose_config(*args), tmp_path / "b")
    resumed.fit()
    for p, q in zip(straight.params, resumed.params):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    for h, k in zip(straight.update.ivon.hessians(), resumed.update.ivon.hessians()):
        torch.testing.assert_close(h, k, rtol=0, atol=0)
    assert straight.update.hess_mean() != pytest.approx(0.1)  # h moved away from h0
