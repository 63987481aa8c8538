"""FIBER: A(omega) on white noise, omega = 1 is DP-AdamBC, v_bar is unbiased, ablations."""

from __future__ import annotations

import functools

import pytest
import torch

from dpbench.errors import ConfigError
from dpbench.methods.dpadam_bc import DPADAM_BC, AdamBC
from dpbench.methods.fiber import FIBER, ema_noise_gain, innovation_noise_gain
from tests.helpers.config import compose_config, run_config
from tests.helpers.method_steps import (
    ctx,
    info,
    params_like,
    released_stream,
    run_post_release,
    set_up,
)

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

ADAMBC = functools.partial(AdamBC, lr=0.01, weight_decay=0.01, eps_v=1e-6)


def _filtered_variance(filter_name: str, omega: float, steps: int = 400,
                       coords: int = 20000) -> float:
    """Return Var(g~_T) when FIBER's own filter runs on unit white noise."""
    method = set_up(FIBER.configured(optimizer=ADAMBC, omega=omega, filter=filter_name).halves(),
                    params_like(shapes=((coords,),)))
    gen = torch.Generator().manual_seed(3)
    out = None
    for t in range(steps):
        out = method.update.postprocess([torch.randn(coords, generator=gen)], ctx(step=t))
    return float(out[0].var())


@pytest.mark.parametrize("omega", [0.1, 0.3, 0.7, 1.0])
def test_noise_gain_is_the_empirical_stationary_variance_ratio(omega):
    assert innovation_noise_gain(omega) == pytest.approx((2 - omega) / (4 - 3 * omega))
    assert _filtered_variance("innovation", omega) == pytest.approx(
        innovation_noise_gain(omega), rel=0.04)
    assert _filtered_variance("ema", omega) == pytest.approx(ema_noise_gain(omega), rel=0.04)


def test_noise_gain_limits():
    assert innovation_noise_gain(1.0) == 1.0
    assert innovation_noise_gain(1e-9) == pytest.approx(0.5)


def test_omega_one_equals_dpadam_bc():
    ours, ref = params_like(), params_like()
    fiber = set_up(FIBER.configured(optimizer=ADAMBC, kappa=1.0, omega=1.0).halves(), ours)
    bc = set_up(DPADAM_BC.configured(optimizer=ADAMBC).halves(), ref)
    stream = released_stream(30)
    run_post_release(fiber, stream, noise_std=0.08)
    run_post_release(bc, stream, noise_std=0.08)
    for p, q in zip(ours, ref):
        torch.testing.assert_close(p, q)
    smoothed = set_up(FIBER.configured(optimizer=ADAMBC, kappa=1.0, omega=0.5), params_like())
    run_post_release(smoothed, stream, noise_std=0.08)
    assert (smoothed.params[0] - ours[0]).abs().max() > 1e-3


def _v_bar_error(correction: str, omega: float = 0.3, sigma_w: float = 1.0) -> float:
    """Return mean(v_bar - c^2) / sigma_w^2 on constant gradients c plus N(0, sigma_w^2)."""
    coords, steps = 20000, 3000
    params = params_like(shapes=((coords,),))
    method = set_up(FIBER.configured(optimizer=functools.partial(AdamBC, lr=0.0, betas=(0.9, 0.999),
                                                      eps_v=1e-12),
                          omega=omega, correction=correction).halves(), params)
    gen = torch.Generator().manual_seed(7)
    clean = torch.linspace(1.0, 3.0, coords) * sigma_w
    for t in range(steps):
        c = ctx(step=t, noise_std=sigma_w)
        released = [clean + sigma_w * torch.randn(coords, generator=gen)]
        method.update.update(method.update.postprocess(released, c), c)
    v_bar = method.update.optimizer.corrected_second_moment(params[0])
    return float((v_bar - clean ** 2).mean()) / sigma_w ** 2


def test_filter_aware_v_bar_is_unbiased_and_the_standard_correction_is_not():
    a = innovation_noise_gain(0.3)
    assert abs(_v_bar_error("filter_aware")) < 0.05
    assert _v_bar_error("standard") == pytest.approx(a - 1.0, abs=0.05)  # over-corrects
    assert _v_bar_error("none") == pytest.approx(a, abs=0.05)  # inflated by A sigma_w^2


def test_removed_variance_per_correction():
    c = ctx(noise_std=0.2)
    for correction, expected in [("filter_aware", innovation_noise_gain(0.5) * 0.04),
                                 ("standard", 0.04), ("none", 0.0)]:
        method = FIBER.configured(optimizer=ADAMBC, omega=0.5, correction=correction).halves()
        assert method.update.removed_variance(c) == pytest.approx(expected)
    ema = FIBER.configured(optimizer=ADAMBC, omega=0.5, filter="ema").halves()
    assert ema.update.removed_variance(c) == pytest.approx(ema_noise_gain(0.5) * 0.04)


def test_state_round_trip_continues_identically():
    stream = released_stream(12)
    straight = set_up(FIBER.configured(optimizer=ADAMBC).halves(), params_like())
    run_post_release(straight, stream, noise_std=0.05)
    first = set_up(FIBER.configured(optimizer=ADAMBC).halves(), params_like())
    run_post_release(first, stream[:6], noise_std=0.05)
    resumed_params = [torch.nn.Parameter(p.detach().clone()) for p in first.params]
    resumed = set_up(FIBER.configured(optimizer=ADAMBC).halves(), resumed_params)
    resumed.load_state_dict(first.state_dict())
    run_post_release(resumed, stream[6:], noise_std=0.05)
    for p, q in zip(straight.params, resumed.params):
        torch.testing.assert_close(p, q)
    points = resumed.mechanism.evaluation_points(ctx(step=12))
    assert len(points) == 2 and points[1].offsets is not None


@pytest.mark.parametrize("key,value", [("omega", 0.0), ("omega", 1.5), ("filter", "kalman"),
                                       ("correction", "half")])
def test_bad_settings_are_config_errors(key, value):
    with pytest.raises(ConfigError, match=key):
        FIBER.configured(optimizer=ADAMBC, **{key: value}).halves().mechanism.validate(info())


def test_correction_needs_adambc_but_none_does_not():
    with pytest.raises(ConfigError, match="AdamBC"):
        set_up(FIBER.configured(optimizer=lambda p: torch.optim.AdamW(p, lr=0.01)),
               params_like())
    set_up(FIBER.configured(optimizer=lambda p: torch.optim.AdamW(p, lr=0.01),
                            correction="none"), params_like())


# ---- through the loop: same privacy as DP-AdamW, compute recorded ------------------------
RUN = ["dataset=digits", "model=logreg", "privacy=eps1", "trainer.epochs=1",
       "trainer.batch_size=64", "trainer.checkpoint=false"]


def test_epsilon_and_ledger_equal_dpadamw_and_evaluations_are_recorded():
    base = run_config(compose_config("method=dpadamw", *RUN))
    for name, evaluations in [("disk", 2), ("dpadam_bc", 1), ("fiber", 2)]:
        out = run_config(compose_config(f"method={name}", *RUN))
        assert out["epsilon"] == base["epsilon"]
        assert out["noise_multiplier"] == base["noise_multiplier"]
        assert out["privacy_ledger"] == base["privacy_ledger"]
        assert out["method_summary"]["gradient_evaluations_per_step"] == evaluations
        assert out["metrics"]["accuracy"] > 0.3  # it learns (10 classes: chance is 0.1)


def test_ghost_clipping_is_refused_before_training():
    from dpbench.experiment import build_trainer

    with pytest.raises(ConfigError, match="ghost"):
        build_trainer(compose_config("method=fiber", *RUN, "trainer.grad_sample_mode=ghost"),
                      None)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["disk", "fiber"])
def test_resume_mid_run_equals_uninterrupted(tmp_path, method):
    """theta_{t-1}, g~ and r survive the checkpoint: a killed run resumes bit-identically."""
    from dpbench.experiment import build_trainer
    from tests.helpers.callbacks import Crash as _Crash

    overrides = [f"method={method}", "model=logreg", "dataset=digits", "trainer.epochs=2",
                 "trainer.batch_size=64"]
    full = run_config(compose_config(*overrides), tmp_path / "full")
    trainer = build_trainer(compose_config(*overrides), tmp_path / "cut",
                            [_Crash(epoch=2, after=3)])
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    resumed = run_config(compose_config(*overrides, "trainer.resume=true"), tmp_path / "cut")
    assert resumed["privacy_ledger"] == full["privacy_ledger"]
    assert resumed["metrics"]["accuracy"] == full["metrics"]["accuracy"]
    assert resumed["metrics"]["loss"] == full["metrics"]["loss"]
