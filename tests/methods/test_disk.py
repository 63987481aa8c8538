"""DiSK: the two-point observation (through the loop's release), the filter, kappa = 1."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from dpbench.errors import ConfigError
from dpbench.methods.disk import DISK
from dpbench.methods.dpadamw import DPADAMW
from dpbench.tasks.classification import Classification
from dpbench.training.engine.choice import build_engine
from dpbench.training.step import plan_at, private_release
from tests.helpers.method_steps import (
    ctx,
    info,
    params_like,
    post_release,
    released_stream,
    run_post_release,
    set_up,
)
from tests.helpers.numerics import assert_matches_reference

ADAMW = functools.partial(torch.optim.AdamW, lr=0.01, weight_decay=0.01)


def test_kappa_one_equals_the_base_optimiser():
    ours, ref = params_like(), params_like()
    disk = set_up(DISK.configured(optimizer=ADAMW, kappa=1.0, gamma=0.5).halves(), ours)
    base = set_up(DPADAMW.configured(optimizer=ADAMW).halves(), ref)
    stream = released_stream(20)
    run_post_release(disk, stream, noise_std=0.1)
    run_post_release(base, stream, noise_std=0.1)
    for p, q in zip(ours, ref):
        torch.testing.assert_close(p, q)
    assert disk.mechanism.gradient_evaluations_per_step() == 1
    assert len(disk.mechanism.evaluation_points(ctx(step=5))) == 1


def test_filter_follows_the_papers_convention():
    params = params_like()
    disk = set_up(DISK.configured(optimizer=ADAMW, kappa=0.7, gamma=0.5).halves(), params)
    stream = released_stream(6)
    out = None
    for t, grads in enumerate(stream):
        out = disk.update.postprocess(grads, ctx(step=t))
    expected = stream[0][0].clone()
    for grads in stream[1:]:
        expected = 0.3 * expected + 0.7 * grads[0]  # g~ = (1 - kappa) g~ + kappa g
    torch.testing.assert_close(out[0], expected)


def test_evaluation_points_use_the_last_displacement():
    params = params_like()
    disk = set_up(DISK.configured(optimizer=ADAMW, kappa=0.7, gamma=0.5).halves(), params)
    assert len(disk.mechanism.evaluation_points(ctx())) == 1  # d_0 = 0: one evaluation
    before = [p.detach().clone() for p in params]
    run_post_release(disk, released_stream(1), noise_std=0.1)
    a = 0.3 / (0.7 * 0.5)
    points = disk.mechanism.evaluation_points(ctx(step=1))
    assert [pt.weight for pt in points] == pytest.approx([1 - a, a])
    assert points[0].offsets is None
    for off, p, b in zip(points[1].offsets, params, before):
        torch.testing.assert_close(off, 0.5 * (p.detach() - b))
    assert disk.mechanism.gradient_evaluations_per_step() == 2
    lookahead_only = set_up(DISK.configured(optimizer=ADAMW, kappa=0.5, gamma=1.0),
                            params_like())
    run_post_release(lookahead_only, released_stream(1), noise_std=0.1)
    assert [pt.weight for pt in lookahead_only.mechanism.evaluation_points(ctx(step=1))] == [1.0]


def test_release_combines_the_two_points_per_example_before_clipping():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    engine = build_engine(model, "hooks")
    params = engine.params
    disk = set_up(DISK.configured(optimizer=functools.partial(torch.optim.SGD, lr=0.5), kappa=0.5,
                       gamma=0.5).halves(), params)
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    task = Classification()
    post_release(disk, [torch.randn_like(p) for p in params], ctx())  # moves theta: d != 0
    c = ctx(step=1)
    c.clip_norm = 0.05  # clips every example: clipping the sum would differ
    release = private_release(disk.mechanism, engine, task, (x, y), c,
                              plan_at(disk.mechanism, 0.0, c.expected_batch_size),
                              max_physical=None)
    a, gamma = disk.mechanism.lookahead_weight, 0.5
    d = [p.detach() - prev for p, prev in zip(params, disk.mechanism.previous_params)]
    expected = [torch.zeros_like(p, dtype=torch.float64) for p in params]  # float64 reference
    for i in range(6):
        per_point = []
        for offset in (None, d):
            ref = nn.Linear(4, 3).double()
            with torch.no_grad():
                for q, p, dd in zip(ref.parameters(), params, offset or [0, 0]):
                    q.copy_(p.detach() + gamma * dd if offset is not None else p.detach())
            loss = nn.functional.cross_entropy(ref(x[i:i + 1].double()), y[i:i + 1])
            per_point.append(torch.autograd.grad(loss, list(ref.parameters())))
        u = [(1 - a) * g0 + a * g1 for g0, g1 in zip(*per_point)]
        norm = torch.sqrt(sum((g ** 2).sum() for g in u))
        for e, g in zip(expected, u):
            e.add_(g * min(1.0, 0.05 / float(norm)))
    for got, e in zip(release.grads, expected):
        assert_matches_reference(got, e / c.expected_batch_size, dtype=torch.float32,
                                 reduction=6, name="released gradient")
    assert float(release.norms.max()) > 0.05


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="kappa"):
        DISK.configured(optimizer=ADAMW, kappa=0.0).halves().mechanism.validate(info())
    with pytest.raises(ConfigError, match="gamma"):
        DISK.configured(optimizer=ADAMW, gamma=-1).halves().mechanism.validate(info())
    with pytest.raises(ConfigError, match="no setting"):
        DISK.configured(optimizer=ADAMW, omega=0.5).halves()
