"""Two-point methods (DiSK, FIBER) and IVON with several samples under book-keeping.

``d_i = sum_k w_k g_i(theta_k)`` is clipped per example. Book-keeping forms ``||d_i||^2`` with
the cross terms ``2 w_k w_l <g_i(theta_k), g_i(theta_l)>`` from each point's activations and
output gradients and the clipped sum as one re-weighted weight gradient per point; no
``g_i`` is materialised. Its pre-noise aggregate must equal the materialised path's (Opacus
hooks, ``clipped_aggregate`` combining per-example gradients) computed in float64, to
``1e-5`` relative; the per-run check must cover the two-point path (a wrong cross term is
refused before any release) and ghost clipping must refuse such a method up front.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpbench.errors import ConfigError
from dpbench.methods import get_method
from dpbench.methods.base import EvalPoint, StepContext
from dpbench.training.engine.bookkeeping import BookKeepingEngine
from dpbench.training.engine.choice import (
    build_engine,
    build_verified_engine,
    choose_grad_sample_mode,
)
from dpbench.training.step import clipped_aggregate, plan_at
from dpbench.utils.tensors import parameters_at
from tests.helpers import engine_grid as grid
from tests.helpers.engines import ONE_POINT
from tests.helpers.numerics import assert_matches_reference

RELATIVE = 1e-5


class _Task:
    observes_gradients = False

    @staticmethod
    def per_example_loss(model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y, reduction="none")


class _TextNet(nn.Module):
    """Embedding (repeated tokens), LayerNorm, token Linear, mean pool, head. No padding row:
    Opacus hooks give it a gradient autograd does not (docs/engine.md), and hooks are the
    reference here."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 8)
        self.norm = nn.LayerNorm(8)
        self.mix = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, ids):
        return self.head(torch.tanh(self.mix(self.norm(self.emb(ids)))).mean(1))


def _models():
    """Return (name, model, inputs, classes): one of each rule family the presets use."""
    torch.manual_seed(0)
    from dpbench.models import get_model_builder
    cnn = get_model_builder("cnn2")((3, 16, 16), 10)
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 5))
    group = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.Tanh(),
                          nn.Flatten(), nn.Linear(8 * 36, 4))
    out = [("mlp", mlp, torch.randn(6, 12), 5), ("cnn2", cnn, torch.randn(5, 3, 16, 16), 10),
           ("conv+groupnorm", group, torch.randn(5, 3, 6, 6), 4),
           ("text", _TextNet(), torch.randint(0, 11, (5, 7)), 3)]
    try:
        import timm  # noqa: F401
        vit = grid.ViTFeatures(reg_tokens=1).vit  # called as a module: Opacus sees its own
        vit.reset_classifier(3)
        out.append(("vit", vit, torch.randn(4, 3, 16, 16), 3))
        from timm.layers import ScaledStdConv2d
        std = nn.Sequential(ScaledStdConv2d(3, 6, 3), nn.Tanh(), nn.Flatten(),
                            nn.Linear(6 * 36, 3))
        out.append(("scaled std conv", std, torch.randn(4, 3, 6, 6), 3))
    except ImportError:
        pass
    return out


MODELS = _models()


def _context(n: int, clip: float) -> StepContext:
    return StepContext(step=1, epoch=0, private=True, noise_multiplier=1.0, clip_norm=clip,
                       expected_batch_size=float(n), sample_rate=0.5, dataset_size=2 * n,
                       total_steps=10)


def _two_point_method(name: str, model: nn.Module):
    """Return DiSK/FIBER's mechanism with a previous step (so theta + gamma d is a second
    point)."""
    method = get_method(name).halves().mechanism
    params = [p for p in model.parameters() if p.requires_grad]
    method.params = params
    gen = torch.Generator().manual_seed(5)
    # drawn in float64 whatever the model's dtype: the same points for every precision
    method.previous_params = [
        p.detach() - (0.3 * (p.detach().double().abs().mean() + 1e-3)
                      * torch.randn(p.shape, generator=gen, dtype=torch.float64)).to(p.dtype)
        for p in params]
    return method


def _aggregate(method_name: str, model: nn.Module, mode: str, batch, clip: float):
    method = _two_point_method(method_name, model)
    ctx = _context(len(batch[1]), clip)
    points = method.evaluation_points(ctx)
    assert len(points) == 2 and points[0].weight != 1.0
    engine = (BookKeepingEngine(model) if mode == "bk"
              else build_engine(model, mode))
    try:
        return clipped_aggregate(method, engine, _Task(), batch, ctx,
                                 plan_at(method, 1.0, ctx.expected_batch_size), None)
    finally:
        engine.close()


@pytest.mark.parametrize("method", ["disk", "fiber"])
@pytest.mark.parametrize("name,model,x,classes", MODELS, ids=[m[0] for m in MODELS])
def test_two_point_bk_equals_materialised_hooks_in_float64(method, name, model, x, classes):
    y = torch.randint(0, classes, (len(x),), generator=torch.Generator().manual_seed(1))
    ref64 = copy.deepcopy(model).double()
    x64 = x.double() if x.is_floating_point() else x
    # Opacus hooks leave the ViT's own parameters to functorch (the materialised path auto
    # takes for it)
    mode = "functorch" if name == "vit" else "hooks"
    # the clip norm: the median combined norm, so that about half the examples are clipped
    probe = _aggregate(method, copy.deepcopy(ref64), mode, (x64, y), 1e30)
    clip = float(probe.norms.median())
    ref = _aggregate(method, copy.deepcopy(ref64), mode, (x64, y), clip)
    assert 0 < float((ref.factors < 1).double().mean()) < 1  # clipping is active
    for dtype, bound in ((torch.float64, RELATIVE), (torch.float32, None)):
        got = _aggregate(method, copy.deepcopy(model).to(dtype), "bk",
                         (x.to(dtype) if x.is_floating_point() else x, y), clip)
        kw = ({"safety": bound / torch.finfo(torch.float64).eps} if bound else {})
        assert_matches_reference(got.norms, ref.norms, dtype=dtype, per_row=True,
                                 reduction=256, name=f"{name} {method} norms {dtype}", **kw)
        for j, (s, r) in enumerate(zip(got.sums, ref.sums)):
            assert_matches_reference(s, r, dtype=dtype, reduction=256,
                                     name=f"{name} {method} sum {j} {dtype}", **kw)
        assert float((got.factors.double() - ref.factors).abs().max()) <= 1e-5


def test_bk_combination_has_the_cross_term():
    """||w1 g + w2 g'||^2 differs from w1^2 ||g||^2 + w2^2 ||g'||^2: bk must match the former."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 3))
    x, y = torch.randn(5, 4).double(), torch.randint(0, 3, (5,))
    model = model.double()
    params = list(model.parameters())
    points = [EvalPoint(-0.5), EvalPoint(1.5, [0.1 * torch.randn_like(p) for p in params])]
    engine = BookKeepingEngine(model)
    _, norms, _, _, _ = engine.clipped_sum(_Task.per_example_loss, (x, y), points,
                                                    torch.ones_like)
    per_point = []
    for point in points:
        grads = []
        for i in range(5):
            offs = point.offsets or [torch.zeros_like(p) for p in params]
            with torch.no_grad():
                for p, d in zip(params, offs):
                    p.add_(d)
            g = torch.autograd.grad(_Task.per_example_loss(model, (x[i:i + 1], y[i:i + 1])).sum(),
                                    params)
            with torch.no_grad():
                for p, d in zip(params, offs):
                    p.sub_(d)
            grads.append(torch.cat([v.flatten() for v in g]))
        per_point.append(torch.stack(grads))
    d = points[0].weight * per_point[0] + points[1].weight * per_point[1]
    assert_matches_reference(norms, d.norm(dim=1), per_row=True, name="combined norms")


def test_ivon_with_two_samples_runs_under_bk_and_auto_picks_it():
    from dpbench.methods.ivon import IVONOptimizer
    method = get_method("dp_ivon").configured(
        optimizer=lambda p: IVONOptimizer(p, lr=0.1), mc_samples=2, hess="gradsq")
    model = nn.Linear(3, 2)
    assert choose_grad_sample_mode("auto", model, method, None) == "bk"


def test_ghost_refuses_a_two_point_method_up_front():
    model = nn.Linear(3, 2)
    method = get_method("disk").configured(optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    with pytest.raises(ConfigError, match="ghost.*2 evaluation points"):
        choose_grad_sample_mode("ghost", model, method, None)
    assert choose_grad_sample_mode("auto", model, method, None) == "bk"
    assert choose_grad_sample_mode("bk", model, method, None) == "bk"


class _WrongCrossTerm(BookKeepingEngine):
    """Book-keeping whose combination drops the cross terms (norms of the points apart)."""

    def clipped_sum(self, loss_fn, batch, points, factors_fn, observe=None):
        if len(points) == 1:
            return super().clipped_sum(loss_fn, batch, points, factors_fn, observe)
        sums, norm_sq, losses = None, 0.0, None
        for point in points:
            with parameters_at(self.params, point.offsets):
                s, n, _, loss, k = super().clipped_sum(loss_fn, batch, ONE_POINT,
                                                       torch.ones_like)
            norm_sq = norm_sq + (point.weight * n) ** 2
            sums = [point.weight * v for v in s] if sums is None else \
                [a + point.weight * v for a, v in zip(sums, s)]
            losses = loss if losses is None else losses
        norms = norm_sq.sqrt()
        f = factors_fn(norms)
        return [v * float(f.mean()) for v in sums], norms, f, losses, k


def test_per_run_check_refuses_a_two_point_path_without_cross_terms(monkeypatch):
    from torch.utils.data import TensorDataset

    from dpbench.training.engine import choice
    from dpbench.training.engine.check import EngineVerifier
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    data = TensorDataset(torch.randn(8, 4), torch.randint(0, 3, (8,)))
    method = get_method("disk").configured(optimizer=lambda p: torch.optim.SGD(p, lr=0.1))

    def verifier():
        return EngineVerifier(model, _Task.per_example_loss, data, torch.device("cpu"))

    engine, check, _ = build_verified_engine("bk", model, method, None, verifier())
    assert engine.mode == "bk" and check.passed and check.points == 2
    engine.close()
    real = choice.build_engine
    monkeypatch.setattr(choice, "build_engine", lambda model, mode: _WrongCrossTerm(model)
                        if mode == "bk" else real(model, mode))
    with pytest.raises(ConfigError, match="two-point combination"):
        build_verified_engine("bk", model, method, None, verifier())
    # auto moves on to the materialised path, which is checked on the combination too
    engine, check, rejected = build_verified_engine("auto", model, method, None, verifier())
    assert engine.mode == "hooks" and check.points == 2 and rejected[0]["engine"] == "bk"


class _ModifiesItsInput(nn.Module):
    """Reads x in ``fc``, then scales x in place before ``skip`` reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.skip = nn.Linear(4, 3), nn.Linear(4, 3)

    def forward(self, x):
        h = self.fc(x)
        x.mul_(2.0)
        return h + self.skip(x)


@pytest.mark.parametrize("two_points", [False, True])
def test_bk_refuses_an_input_modified_in_place_after_the_layer_read_it(two_points):
    """The rules read the recorded input: a later in-place change (in the forward, or by a
    later evaluation point's forward) would make them compute another gradient."""
    model = _ModifiesItsInput()
    engine = BookKeepingEngine(model)

    def loss(m, batch):
        return m(batch[0].clone()).sum(1) if not two_points else m(batch[0]).sum(1)

    x = torch.randn(3, 4)
    with pytest.raises(ConfigError, match="modified in place after the layer read it"):
        if two_points:
            points = [EvalPoint(0.5), EvalPoint(0.5, [torch.zeros_like(p)
                                                      for p in engine.params])]
            engine.clipped_sum(loss, (x, None), points, torch.ones_like)
        else:
            engine.clipped_sum(loss, (x, None), ONE_POINT, torch.ones_like)


def _disk_aggregate(model, batch, max_physical=None):
    method = _two_point_method("disk", model)
    ctx = _context(len(batch[1]), 0.5)
    engine = BookKeepingEngine(model)
    try:
        return clipped_aggregate(method, engine, _Task(), batch, ctx,
                                 plan_at(method, 1.0, ctx.expected_batch_size), max_physical)
    finally:
        engine.close()


def test_two_point_bk_in_physical_chunks_equals_one_chunk():
    torch.manual_seed(7)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Tanh(), nn.Flatten(),
                          nn.Linear(64, 3)).double()
    batch = (torch.randn(7, 3, 6, 6, dtype=torch.float64), torch.randint(0, 3, (7,)))
    whole = _disk_aggregate(copy.deepcopy(model), batch)
    chunked = _disk_aggregate(copy.deepcopy(model), batch, max_physical=3)
    assert_matches_reference(chunked.norms, whole.norms, per_row=True, name="norms")
    for s, r in zip(chunked.sums, whole.sums):
        assert_matches_reference(s, r, name="chunked sum")


def test_two_point_bk_drops_a_nonfinite_example_exactly():
    """A NaN example contributes 0 at both points; the others' sums are those without it."""
    torch.manual_seed(8)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    x, y = torch.randn(6, 5, dtype=torch.float64), torch.randint(0, 3, (6,))
    clean = _disk_aggregate(copy.deepcopy(model), (x[1:], y[1:]))
    x[0, 2] = float("nan")
    got = _disk_aggregate(copy.deepcopy(model), (x, y))
    assert len(got.norms) == 5 and bool(torch.isfinite(got.norms).all())
    assert_matches_reference(got.norms, clean.norms, per_row=True, name="norms")
    for s, r in zip(got.sums, clean.sums):
        assert bool(torch.isfinite(s).all())
        assert_matches_reference(s, r, name="sum without the NaN example")
