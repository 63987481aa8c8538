"""DP-AdamBC: the optimiser against torch's AdamW and against the paper's formula."""

from __future__ import annotations

import functools

import pytest
import torch

from dpbench.errors import ConfigError
from dpbench.methods.dpadam_bc import DPADAM_BC, AdamBC
from tests.helpers.method_steps import ctx, params_like, released_stream, run_post_release, set_up
from tests.helpers.numerics import SAFETY, assert_matches_reference, assert_trajectory_matches


def test_adambc_without_correction_equals_torch_adamw():
    """Ours in float32 follows torch's AdamW in float64 on the same gradients, step by step."""
    ours = params_like()
    ref = [torch.nn.Parameter(p.detach().double()) for p in params_like()]
    opt = AdamBC(ours, lr=0.01, weight_decay=0.1, eps=1e-8, eps_v=0.0, noise_variance=0.0)
    torch_opt = torch.optim.AdamW(ref, lr=0.01, weight_decay=0.1, eps=1e-8)
    trajectory, reference = [], []
    for grads in released_stream(25):
        for p, q, g in zip(ours, ref, grads):
            p.grad, q.grad = g.clone(), g.double()
        opt.step()
        torch_opt.step()
        trajectory.append(torch.cat([p.detach().flatten() for p in ours]))
        reference.append(torch.cat([q.detach().flatten() for q in ref]))
    assert_trajectory_matches(trajectory, reference, dtype=torch.float32, name="parameters")


def _reference_adambc(theta, stream, lr, betas, eps, eps_v, sigma_w2):
    """Tang et al. (2024) Alg. 1 written out in float64, one parameter tensor."""
    theta = theta.double().clone()
    m = torch.zeros_like(theta)
    v = torch.zeros_like(theta)
    for t, g in enumerate(stream, start=1):
        g = g.double()
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        m_hat, v_hat = m / (1 - betas[0] ** t), v / (1 - betas[1] ** t)
        theta = theta - lr * m_hat / (torch.clamp(v_hat - sigma_w2, min=eps_v).sqrt() + eps)
    return theta


def test_dpadam_bc_matches_the_papers_update_and_reads_sigma_w_from_ctx():
    params = params_like(shapes=((40,),))
    start = params[0].detach().clone()
    factory = functools.partial(AdamBC, lr=0.01, betas=(0.9, 0.99), eps=0.0, eps_v=1e-4)
    method = set_up(DPADAM_BC.configured(optimizer=factory).halves(), params)
    stream = released_stream(15, shapes=((40,),))
    run_post_release(method, stream, noise_std=0.05)
    assert method.update.optimizer.param_groups[0]["noise_variance"] == pytest.approx(0.05 ** 2)
    expected = _reference_adambc(start, [s[0] for s in stream], 0.01, (0.9, 0.99), 0.0, 1e-4,
                                 0.05 ** 2)
    assert_matches_reference(params[0].detach(), expected, dtype=torch.float32,
                             safety=SAFETY * len(stream), name="parameters")
    # the correction matters on this input: without it the result differs
    plain = _reference_adambc(start, [s[0] for s in stream], 0.01, (0.9, 0.99), 0.0, 1e-4, 0.0)
    assert (plain - expected).abs().max() > 1e-3
    assert 0.0 < method.step_metrics()["v_floored_fraction"] <= 1.0


def test_dpadam_bc_refuses_an_optimiser_that_cannot_correct():
    method = DPADAM_BC.configured(optimizer=lambda p: torch.optim.Adam(p, lr=0.1)).halves()
    with pytest.raises(ConfigError, match="AdamBC"):
        set_up(method, params_like())


def test_adambc_rejects_bad_hyperparameters():
    with pytest.raises(ConfigError):
        AdamBC(params_like(), betas=(0.9, 1.0))
    with pytest.raises(ConfigError):
        AdamBC(params_like(), eps=0.0, eps_v=0.0)


def test_nonprivate_ctx_removes_nothing():
    method = set_up(DPADAM_BC.configured(optimizer=functools.partial(AdamBC, lr=0.01)),
                    params_like())
    c = ctx(noise_std=0.3, private=False)
    method.update.update([torch.ones(5, 3), torch.ones(3)], c)
    assert method.update.optimizer.param_groups[0]["noise_variance"] == 0.0
