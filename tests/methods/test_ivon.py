"""IVON: same trajectory as the ivon-opt oracle; posterior sampling; BMA evaluation; a run."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from dpbench.errors import ConfigError
from dpbench.methods import get_method
from dpbench.methods.base import Halves, RunInfo, StepContext
from dpbench.methods.ivon import IVON, IVONOptimizer
from dpbench.utils.tensors import parameters_at
from tests.helpers.config import compose_config, run_config
from tests.helpers.method_steps import post_release
from tests.helpers.numerics import SAFETY, assert_matches_reference

# hess_init exact in float32: ivon-opt adds it as a float32 tensor even to float64 buffers
HYPER = dict(lr=0.05, hess_init=0.25, beta1=0.9, beta2=0.99, weight_decay=1e-3)


def _problem(seed: int = 0, dtype: torch.dtype = torch.float32):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).to(dtype)
    x, y = torch.randn(40, 5).to(dtype), torch.randint(0, 3, (40,))
    return model, x, y


def _info(n: int, private: bool = False) -> RunInfo:
    return RunInfo(dataset_size=n, expected_batch_size=n, sample_rate=1.0, total_steps=10,
                   noise_multiplier=0.0, clip_norm=1.0, private=private,
                   task="classification", device=torch.device("cpu"))


def _ivon(params, n: int, **settings) -> Halves:
    method = IVON.configured(lambda p: IVONOptimizer(p, ess=n, **HYPER), **settings).halves()
    method.setup(params, _info(n))
    return method


def test_reparam_trajectory_matches_ivon_opt_oracle():
    """Both in float64 (each draws its posterior sample in the parameters' dtype, so a float32
    run cannot share the oracle's float64 draws): equal up to float64 rounding over the steps."""
    ivon_opt = pytest.importorskip("ivon")  # GPL oracle, dev extra only
    steps, seed, n = 6, 123, 1000
    ours_model, x, y = _problem(dtype=torch.float64)
    ref_model, _, _ = _problem(dtype=torch.float64)
    ref = ivon_opt.IVON(ref_model.parameters(), ess=n, hess_approx="price", **HYPER)
    params = list(ours_model.parameters())
    method = _ivon(params, n, hess="reparam")
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # ivon-opt draws its flat noise vector from the global RNG
    loss_fn = nn.CrossEntropyLoss()
    for step in range(steps):
        with ref.sampled_params(train=True):
            ref.zero_grad()
            loss_fn(ref_model(x), y).backward()
        ref.step()
        ctx = StepContext(step=step, epoch=0, private=False, noise_multiplier=0.0,
                          clip_norm=1.0, expected_batch_size=40, sample_rate=1.0,
                          dataset_size=n, total_steps=steps, method_generator=gen)
        (point,) = method.mechanism.evaluation_points(ctx)
        with parameters_at(params, point.offsets):
            grads = torch.autograd.grad(loss_fn(ours_model(x), y), params)
        post_release(method, list(grads), ctx, points=(point,))  # the update, then advance
    start, _, _ = _problem(dtype=torch.float64)
    for p, q, p0 in zip(params, ref_model.parameters(), start.parameters()):
        assert_matches_reference(p.detach() - p0.detach(), q.detach() - p0.detach(),
                                 reduction=40, safety=SAFETY * steps, name="parameters moved")
    ref_hess = ref.param_groups[0]["hess"]
    ours_hess = torch.cat([h.flatten() for h in method.update.ivon.hessians()])
    assert ours_hess.dtype == ref_hess.dtype == torch.float64
    assert_matches_reference(ours_hess, ref_hess, reduction=40, safety=SAFETY * steps,
                             name="hessian")
    assert not torch.allclose(ours_hess, torch.full_like(ours_hess, HYPER["hess_init"]))


def test_posterior_samples_follow_n_m_one_over_n_h_delta():
    n = 500
    model, _, _ = _problem()
    params = list(model.parameters())
    method = _ivon(params, n)
    with torch.no_grad():  # a non-uniform h so the variance check is per coordinate
        for h in method.update.ivon.hessians():
            h.copy_(torch.linspace(0.01, 2.0, h.numel()).view_as(h))
    gen = torch.Generator().manual_seed(0)
    draws = [method.update.ivon.sample_offsets(gen) for _ in range(4000)]
    for i, h in enumerate(method.update.ivon.hessians()):
        sample = torch.stack([d[i] for d in draws])
        var = 1.0 / (n * (h + HYPER["weight_decay"]))
        # mean 0 within 5 standard errors; variance within 10% (4000 draws: se ~ 2.2%)
        assert (sample.mean(0).abs() <= 5 * (var / len(draws)).sqrt()).all()
        ratio = sample.var(0) / var
        assert ((ratio - 1).abs() < 0.1).all(), float((ratio - 1).abs().max())


def test_evaluation_points_average_mc_samples_with_weight_one_over_s():
    model, _, _ = _problem()
    method = _ivon(list(model.parameters()), 100, hess="gradsq", mc_samples=4)
    ctx = StepContext(step=0, epoch=0, private=True, noise_multiplier=1.0, clip_norm=1.0,
                      expected_batch_size=10, sample_rate=0.1, dataset_size=100,
                      total_steps=1, method_generator=torch.Generator().manual_seed(0))
    points = method.mechanism.evaluation_points(ctx)
    assert len(points) == 4 and math.isclose(sum(p.weight for p in points), 1.0)
    assert not torch.equal(points[0].offsets[0], points[1].offsets[0])


@pytest.mark.parametrize("settings", [{"hess": "diag"}, {"hess": "reparam", "mc_samples": 2},
                                      {"mc_samples": 0}, {"eval_samples": -1}])
def test_bad_settings_are_config_errors(settings):
    with pytest.raises(ConfigError):
        IVON.configured(**settings).halves().setup([], _info(10))


def test_wrong_optimizer_is_a_config_error():
    model, _, _ = _problem()
    method = IVON.configured(lambda p: torch.optim.SGD(p, lr=0.1)).halves()
    with pytest.raises(ConfigError, match="IVONOptimizer"):
        method.setup(list(model.parameters()), _info(10))


def test_ivon_run_is_nonprivate_and_reports_bma_and_mean_metrics(tmp_path):
    cfg = compose_config("method=ivon", "dataset=digits", "model=logreg", "trainer.epochs=2",
                         "trainer.batch_size=64", "method.optimizer.lr=0.5",
                         "method.settings.eval_samples=4")
    out = run_config(cfg, tmp_path)
    assert get_method("ivon").private is False and out["private"] is False
    assert math.isinf(out["epsilon"])
    m = out["metrics"]
    for key in ("accuracy", "nll", "ece", "brier", "at_mean_accuracy", "at_mean_ece"):
        assert key in m
    assert m["accuracy"] > 0.5  # digits, 2 epochs of logistic regression
    assert 0 <= m["ece"] <= 1 and 0 <= m["brier"] <= 2
