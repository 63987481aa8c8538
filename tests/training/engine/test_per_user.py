"""Per-user clipping (privacy.unit=user, ULS): each user's gradient sum is formed before its
norm is clipped; one user's records all changing moves the pre-noise sum by at most C; the
per-run check refuses an engine whose per-user sums are wrong; an engine without per-user
sums refuses in one line (bk and ghost: test_per_user_engines.py).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from dpbench.errors import ConfigError
from dpbench.training.engine.check import EngineVerifier
from dpbench.training.engine.choice import build_engine, refusal
from dpbench.training.engine.per_user import clip_per_user
from dpbench.training.engine.protocol import ClippedSum


def _loss(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y, reduction="none")


def _model(dtype=torch.float64):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).to(dtype)


def _data(n=12, dtype=torch.float64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 5, generator=g, dtype=dtype), torch.randint(0, 3, (n,), generator=g)


class _Point:
    weight, offsets = 1.0, None


def _clip(c):
    return lambda norms: (c / norms.clamp_min(1e-30)).clamp(max=1.0)


def _reference_user_sum(model, batch, users, c):
    """float64 reference: per-user gradient of the summed loss, clipped to c, summed."""
    params = list(model.parameters())
    total = [torch.zeros_like(p) for p in params]
    for u in torch.unique(users).tolist():
        rows = (users == u).nonzero().flatten()
        loss = _loss(model, (batch[0][rows], batch[1][rows])).sum()
        g = torch.autograd.grad(loss, params)
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(x) for x in g]))
        f = min(1.0, c / float(norm))
        total = [t + f * x for t, x in zip(total, g)]
    return total


@pytest.mark.parametrize("mode", ["hooks", "functorch"])
def test_per_user_sum_matches_float64_reference(mode):
    model, batch = _model(), _data()
    users = torch.tensor([4, 1, 4, 9, 1, 4, 9, 9, 9, 2, 4, 1])
    ref = _reference_user_sum(model, batch, users, 0.05)
    engine = build_engine(model, mode)
    out = engine.clipped_user_sum(_loss, batch, users, [_Point()], _clip(0.05))
    assert out.norms.shape == (4,) and out.kept.all()
    tol = 64 * torch.finfo(torch.float64).eps
    for a, b in zip(out.sums, ref):
        assert torch.allclose(a, b, rtol=tol, atol=tol)
    engine.close()


def _pre_noise(engine, batch, users, c):
    return torch.cat([s.flatten() for s in engine.clipped_user_sum(
        _loss, batch, users, [_Point()], _clip(c)).sums])


def test_one_users_records_all_changing_moves_the_sum_by_at_most_c():
    """Replace every record of user 4 (4 rows) by arbitrary ones, and remove the user: the
    pre-noise sum moves by at most C each time (add/remove of the user: sensitivity C)."""
    model, (x, y) = _model(), _data()
    users = torch.tensor([4, 1, 4, 9, 1, 4, 9, 9, 9, 2, 4, 1])
    engine = build_engine(model, "hooks")
    c = 0.3
    base = _pre_noise(engine, (x, y), users, c)
    other = users != 4
    removed = _pre_noise(engine, (x[other], y[other]), users[other], c)
    assert float((base - removed).norm()) <= c * (1 + 1e-9)
    for seed in range(3):
        x2, y2 = x.clone(), y.clone()
        fresh = _data(12, seed=10 + seed)
        rows = users == 4
        x2[rows], y2[rows] = 50 * fresh[0][rows], fresh[1][rows]
        changed = _pre_noise(engine, (x2, y2), users, c)
        # replacing all of a user's records: at most 2C (remove, then add)
        assert float((base - changed).norm()) <= 2 * c * (1 + 1e-9)
        assert float((removed - changed).norm()) <= c * (1 + 1e-9)
    engine.close()


def test_the_broken_switch_lets_a_user_exceed_c():
    """The test-only fault (clip examples, then sum) lets a user with 4 rows contribute ~4C:
    the bound test above would catch it."""
    model, (x, y) = _model(), _data()
    users = torch.tensor([4, 1, 4, 9, 1, 4, 9, 9, 9, 2, 4, 1])
    engine = build_engine(model, "hooks")
    c = 0.05
    out = clip_per_user(engine.per_example, engine.params, _loss, (x, y), users, [_Point()],
                        _clip(c), broken_sum_after_clip=True)
    other = users != 4
    removed = clip_per_user(engine.per_example, engine.params, _loss, (x[other], y[other]),
                            users[other], [_Point()], _clip(c), broken_sum_after_clip=True)
    moved = torch.cat([(a - b).flatten() for a, b in zip(out.sums, removed.sums)]).norm()
    assert float(moved) > 1.5 * c
    engine.close()


class _Wrapped:
    """An engine passing everything to the real one but its per-user sums."""

    def __init__(self, engine):
        self.engine, self.mode = engine, engine.mode
        self.params, self.names, self.module = engine.params, engine.names, engine.module
        self.materialises, self.per_user = True, True

    def clipped_sum(self, *args, **kwargs):
        return self.engine.clipped_sum(*args, **kwargs)


class _ClipsBeforeSumming(_Wrapped):
    """A wrong per-user engine: its norms are right but each example is clipped before the
    user's sum (the sums differ from the reference)."""

    def clipped_user_sum(self, loss_fn, batch, users, points, factors_fn):
        good = self.engine.clipped_user_sum(loss_fn, batch, users, points, factors_fn)
        bad = clip_per_user(self.engine.per_example, self.params, loss_fn, batch, users,
                            points, factors_fn, broken_sum_after_clip=True)
        return ClippedSum(bad.sums, good.norms, good.factors, good.losses, good.kept)


class _ByPosition(_Wrapped):
    """A wrong per-user engine: it groups consecutive rows as users, not by user id."""

    def clipped_user_sum(self, loss_fn, batch, users, points, factors_fn):
        runs = torch.cumsum(torch.cat([torch.ones(1, dtype=torch.long),
                                       (users[1:] != users[:-1]).long()]), 0)
        return self.engine.clipped_user_sum(loss_fn, batch, runs, points, factors_fn)


def _verifier(model, dtype=torch.float32):
    x, y = _data(8, dtype=dtype)
    return EngineVerifier(model, _loss, TensorDataset(x, y), torch.device("cpu"))


@pytest.mark.parametrize("wrapper", [_ClipsBeforeSumming, _ByPosition])
def test_the_per_run_check_refuses_wrong_per_user_sums(wrapper):
    model = _model(torch.float32)
    verifier = _verifier(model)
    verifier.prepare()
    engine = build_engine(model, "hooks")
    engine.per_user = True
    assert verifier.check(engine).passed  # the real engine passes, per-user path included
    bad = verifier.check(wrapper(engine))
    assert not bad.passed
    assert any("per-user" in f or "user" in f for f in bad.failures), bad.failures
    engine.close()


def test_an_engine_without_per_user_sums_refuses_in_one_line(monkeypatch):
    """Every built-in engine clips per user (test_per_user_engines.py); one that declares it
    cannot is refused in one line naming the key."""
    from dpbench.training.engine.protocol import ENGINES

    class M:
        name, needs_per_example_grads = "dpsgd", False

        def gradient_evaluations_per_step(self):
            return 1

    monkeypatch.setattr(ENGINES.get("ghost"), "per_user_supported", False)
    why = refusal("ghost", M(), object(), per_user=True)
    assert why is not None and "\n" not in why and "privacy.unit=user" in why
    assert refusal("hooks", M(), object(), per_user=True) is None
    with pytest.raises(ConfigError, match="grad_sample_mode=ghost"):
        from dpbench.training.engine.choice import choose_grad_sample_mode
        choose_grad_sample_mode("ghost", _model(), M(), object(), per_user=True)
