"""Per-user clipping in ``bk`` and ``ghost`` (privacy.unit=user, ULS): each user's norm
``||sum_{i in u} g_i||`` and the clipped sum ``sum_u min(1, C / ||D_u||) D_u`` equal a float64
plain-autograd reference and the materialised engines (``hooks``, ``functorch``), for every
layer family book-keeping's rules cover and for the project's models, with users of different
sizes (one of one example), rows out of order; removing one user moves the pre-noise sum by at
most C; the per-run check refuses wrong per-user sums; what has no per-user rule is refused in
one line naming the layer; a batch whose users' rows are not contiguous is refused.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from dpbench.errors import ConfigError, PrivacyError
from dpbench.models import MODELS
from dpbench.training.engine.bookkeeping import bk_per_user_unsupported
from dpbench.training.engine.check import EngineVerifier
from dpbench.training.engine.choice import build_engine, choose_grad_sample_mode, refusal
from dpbench.training.engine.protocol import ClippedSum
from dpbench.training.engine.rules.linear import LinearRule
from dpbench.training.engine.user_rows import UserRows
from tests.helpers import engine_grid as grid
from tests.helpers.engines import ONE_POINT
from tests.helpers.numerics import tolerance
from tests.training.engine.test_per_user import _ByPosition, _Wrapped

#: the users of the rows: sizes 4, 2 and 1, rows of a user out of order
USERS = (3, 8, 3, 5, 3, 8, 3)
#: the layer families whose rules book-keeping has (tests/helpers/engine_grid.py)
FAMILIES = (*grid.BK_FAMILIES, "sequence_bias")
#: the families Opacus's ghost clipping runs (its grad samplers or functorch)
GHOST_FAMILIES = ("linear", "conv2d", "embedding", "layer_norm", "group_norm", "conv1d",
                  "rms_norm")


def _clip(c):
    return lambda norms: (c / norms.clamp_min(1e-30)).clamp(max=1.0)


def _user_reference(model, loss_fn, batch, users, c):
    """float64: each user's gradient (of its rows' summed loss, one user per forward), its
    norm and sum_u min(1, c / ||D_u||) D_u."""
    model = grid.clone(model).double()
    params = [p for p in model.parameters() if p.requires_grad]
    ids = torch.unique(users, sorted=True)
    norms, total = [], [torch.zeros_like(p) for p in params]
    for u in ids.tolist():
        rows = (users == u).nonzero().flatten()
        part = [b[rows].double() if b.is_floating_point() else b[rows] for b in batch]
        g = torch.autograd.grad(loss_fn(model, part).sum(), params, allow_unused=True)
        g = [torch.zeros_like(p) if x is None else x for p, x in zip(params, g)]
        norm = torch.sqrt(sum(float(x.pow(2).sum()) for x in g) * torch.ones((),
                                                                           dtype=torch.float64))
        norms.append(norm)
        f = min(1.0, c / float(norm)) if float(norm) > 0 else 1.0
        total = [t + f * x for t, x in zip(total, g)]
    return torch.stack(norms), total


def _assert_close(out: ClippedSum, ref_norms, ref_sums, dtype, reduction, label):
    tol = tolerance(dtype, reduction)
    scale = float(ref_norms.max())
    err = float((out.norms.double() - ref_norms).abs().max()) / scale
    assert err <= tol, f"{label}: norms off by {err:.3g} > {tol:.3g}"
    whole = sum(float(r.norm()) for r in ref_sums)
    for a, r in zip(out.sums, ref_sums):
        err = float((a.double() - r).norm()) / max(float(r.norm()), 1e-3 * whole)
        assert err <= tol, f"{label}: clipped sum off by {err:.3g} > {tol:.3g}"


def _grid_case(family: str, seed: int) -> grid.Case:
    """A drawn case of ``family`` with 7 rows (the draw's shapes, fresh rows)."""
    torch.manual_seed(seed)
    d = grid.RandomDraw(seed)
    for _ in range(200):
        case = grid.FAMILIES[family](d)
        if case is not None and (family not in grid.BK_FAMILIES or case.bk_claims
                                 or family == "sequence_bias"):
            break
    x = case.x
    n = len(USERS)
    if x.is_floating_point():
        x = torch.randn(n, *x.shape[1:])
    else:
        x = torch.randint(0, int(x.max()) + 1, (n, *x.shape[1:]))
    return grid.Case(case.name, case.model, x, case.bk_claims)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("family", FAMILIES)
def test_bk_and_ghost_per_user_equal_the_float64_reference_on_every_rule(family, seed):
    case = _grid_case(family, seed)
    batch = grid.batch_of(case)
    users = torch.tensor(USERS)
    ref_norms, _ = _user_reference(case.model, grid.loss_fn, batch, users, 1.0)
    c = 0.5 * float(ref_norms.min()) or 1.0  # every user clipped: each direction counts
    ref_norms, ref_sums = _user_reference(case.model, grid.loss_fn, batch, users, c)
    reduction = max(case.x[0].numel(), batch[1][0].numel()) * 4
    # bk always; ghost and hooks where they are exact per example (the per-run check refuses
    # them where not: e.g. Opacus on some channels_last grouped convolutions)
    modes = ["bk"] + [m for m in ("ghost", "hooks") if (m == "hooks" or family in GHOST_FAMILIES)
                      and grid.outcome(case, m)[0] == "exact"]
    for mode in modes:
        engine = build_engine(grid.clone(case.model), mode)
        out = engine.clipped_user_sum(grid.loss_fn, batch, users, ONE_POINT, _clip(c))
        assert out.kept.tolist() == [True, True, True]
        _assert_close(out, ref_norms, ref_sums, torch.float32, reduction,
                      f"{mode} {case.name}")
        engine.close()


def test_the_ghost_norm_path_of_a_conv_per_user():
    """A conv whose per-user ghost norm is cheaper than instantiating (few positions, many
    weights): the regrouped patches' Gram matrices, against the reference."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 16, 3, groups=2), nn.Flatten(), nn.Linear(16, 2))
    x, r = torch.randn(len(USERS), 8, 3, 3), torch.randn(len(USERS), 2)
    users = torch.tensor(USERS)
    ref_norms, ref_sums = _user_reference(model, grid.loss_fn, (x, r), users, 0.01)
    for mode in ("bk", "ghost"):
        engine = build_engine(grid.clone(model), mode)
        out = engine.clipped_user_sum(grid.loss_fn, (x, r), users, ONE_POINT, _clip(0.01))
        _assert_close(out, ref_norms, ref_sums, torch.float32, 72, mode)
        engine.close()


# ---- the project's models ------------------------------------------------------------------
def _ce(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y, reduction="none")


class TinyText(nn.Module):
    """A small token model: embedding, layer norm, a token-wise linear, mean pool, head."""

    def __init__(self, vocab: int = 11, dim: int = 6, classes: int = 3) -> None:
        super().__init__()
        # no padding_idx: Opacus (hooks, ghost) counts the padding row (its per-run check refuses)
        self.emb, self.norm = nn.Embedding(vocab, dim), nn.LayerNorm(dim)
        self.mix, self.head = nn.Linear(dim, dim), nn.Linear(dim, classes)

    def forward(self, x):
        return self.head(torch.tanh(self.mix(self.norm(self.emb(x)))).mean(1))


def _project_model(name: str) -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    n = 10
    g = torch.Generator().manual_seed(1)
    y = torch.randint(0, 3, (n,), generator=g)
    if name == "text":
        return TinyText(), (torch.randint(0, 11, (n, 5), generator=g), y)
    shape = (1, 28, 28) if name == "cnn2" else (12,)
    model = MODELS.get(name)(shape, 3)
    return model, (torch.randn(n, *shape, generator=g), y)


#: 4 users of sizes 4, 3, 2, 1, rows interleaved
MODEL_USERS = (0, 1, 0, 2, 1, 0, 3, 1, 0, 2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["logreg", "mlp", "cnn2", "text"])
def test_models_per_user_equal_hooks_functorch_and_float64(name, dtype):
    model, (x, y) = _project_model(name)
    users = torch.tensor(MODEL_USERS)
    ref_norms, _ = _user_reference(model, _ce, (x, y), users, 1.0)
    c = 0.5 * float(ref_norms.min())
    ref_norms, ref_sums = _user_reference(model, _ce, (x, y), users, c)
    x = x.to(dtype) if x.is_floating_point() else x
    outs = {}
    for mode in ("bk", "ghost", "hooks", "functorch"):
        engine = build_engine(grid.clone(model).to(dtype), mode)
        outs[mode] = engine.clipped_user_sum(_ce, (x, y), users, ONE_POINT, _clip(c))
        engine.close()
        assert outs[mode].norms.shape == (4,) and bool(outs[mode].kept.all())
        _assert_close(outs[mode], ref_norms, ref_sums, dtype, x[0].numel(), f"{mode} {name}")
    for mode in ("bk", "ghost"):  # and the materialised engines, at the same tolerance
        hooks = (outs["hooks"].norms.double(), [s.double() for s in outs["hooks"].sums])
        _assert_close(outs[mode], *hooks, dtype, x[0].numel(), f"{mode} vs hooks {name}")


@pytest.mark.parametrize("mode", ["bk", "ghost"])
def test_removing_one_user_moves_the_pre_noise_sum_by_at_most_c(mode):
    model, (x, y) = _project_model("mlp")
    model = model.double()
    x = x.double()
    users = torch.tensor(MODEL_USERS)
    c = 0.2
    engine = build_engine(model, mode)

    def pre_noise(rows):
        out = engine.clipped_user_sum(_ce, (x[rows], y[rows]), users[rows], ONE_POINT,
                                      _clip(c))
        return torch.cat([s.flatten() for s in out.sums])

    everyone = torch.arange(len(users))
    base = pre_noise(everyone)
    for u in range(4):
        moved = float((base - pre_noise(everyone[users != u])).norm())
        assert 0 < moved <= c * (1 + 1e-9)
    engine.close()


@pytest.mark.parametrize("mode", ["bk", "ghost"])
def test_a_row_without_a_finite_loss_is_dropped_as_hooks_drops_it(mode):
    model, (x, y) = _project_model("mlp")
    model, x = model.double(), x.double()
    x[4] = float("inf")  # user 1's second row
    x[6] = float("nan")  # user 3's only row: the user keeps no example
    users = torch.tensor(MODEL_USERS)
    ref = build_engine(grid.clone(model), "hooks")
    want = ref.clipped_user_sum(_ce, (x, y), users, ONE_POINT, _clip(0.1))
    ref.close()
    engine = build_engine(model, mode)
    got = engine.clipped_user_sum(_ce, (x, y), users, ONE_POINT, _clip(0.1))
    engine.close()
    assert got.kept.tolist() == want.kept.tolist() == [True, True, True, False]
    assert torch.allclose(got.norms, want.norms, rtol=1e-12, atol=0)
    assert torch.allclose(got.factors, want.factors, rtol=1e-12, atol=0)
    assert len(got.losses) == len(want.losses) == 8
    for a, b in zip(got.sums, want.sums):
        assert bool(torch.isfinite(a).all())
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-15)


def test_user_rows_regroup_pads_with_zeros_and_keeps_order():
    rows = UserRows.of(torch.tensor([7, 3, 7, 7]))
    assert rows.ids.tolist() == [3, 7] and rows.width == 3
    x = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    assert rows.regroup(x).squeeze(-1).tolist() == [[2.0, 0.0, 0.0], [1.0, 3.0, 4.0]]
    assert rows.sums(x).squeeze(-1).tolist() == [2.0, 8.0]
    assert rows.per_row(torch.tensor([10.0, 20.0])).tolist() == [20.0, 10.0, 20.0, 20.0]


# ---- the per-run check and the refusals ------------------------------------------------------
def _verifier(model):
    _, (x, y) = _project_model("mlp")
    return EngineVerifier(model, _ce, TensorDataset(x[:8], y[:8]), torch.device("cpu"))


class _ClipsBeforeSumming(_Wrapped):
    """Right per-user norms, but the sum clips each example (the engine's per-example path)."""

    def clipped_user_sum(self, loss_fn, batch, users, points, factors_fn):
        good = self.engine.clipped_user_sum(loss_fn, batch, users, points, factors_fn)
        bad = self.engine.clipped_sum(loss_fn, batch, points, factors_fn)
        return ClippedSum(bad.sums, good.norms, good.factors, good.losses, good.kept)


def _no_cross_terms(self, m, calls, rows):
    """A wrong Linear rule: the sum of the user's examples' squared norms (cross terms lost)."""
    return rows.sums(self.norm_sq(m, calls))


@pytest.mark.parametrize("mode", ["bk", "ghost"])
def test_the_per_run_check_passes_bk_and_ghost_per_user_and_refuses_wrong_sums(mode):
    model, _ = _project_model("mlp")
    verifier = _verifier(model)
    verifier.prepare()
    engine = build_engine(model, mode)
    engine.per_user = True
    assert verifier.check(engine).passed  # the per-user path included
    for wrapper in (_ClipsBeforeSumming, _ByPosition):
        bad = verifier.check(wrapper(engine))
        assert not bad.passed and any("user" in f for f in bad.failures), bad.failures
    engine.close()


def test_the_per_run_check_refuses_a_per_user_rule_without_cross_terms(monkeypatch):
    model, _ = _project_model("mlp")
    verifier = _verifier(model)
    verifier.prepare()
    engine = build_engine(model, "bk")
    engine.per_user = True
    monkeypatch.setattr(LinearRule, "user_norm_sq", _no_cross_terms)
    bad = verifier.check(engine)
    assert not bad.passed and any("norm of user" in f for f in bad.failures), bad.failures
    engine.close()


def test_a_layer_without_a_per_user_rule_is_refused_in_one_line(monkeypatch):
    model, (x, y) = _project_model("mlp")
    monkeypatch.setattr(LinearRule, "per_user", False)
    why = bk_per_user_unsupported(model)
    assert why is not None and "no per-user rule for Linear" in why and "\n" not in why
    engine = build_engine(model, "bk")
    with pytest.raises(ConfigError, match=r"layer '.*' \(Linear\) has no per-user rule") as err:
        engine.clipped_user_sum(_ce, (x, y), torch.tensor(MODEL_USERS), ONE_POINT, _clip(1.0))
    assert "\n" not in str(err.value)
    engine.close()


class _DpSgd:
    name, needs_per_example_grads = "dpsgd", False

    def gradient_evaluations_per_step(self):
        return 1


def test_every_built_in_engine_clips_per_user_and_auto_takes_bk():
    for mode in ("bk", "ghost", "hooks", "functorch"):
        assert refusal(mode, _DpSgd(), object(), per_user=True) is None
    model, _ = _project_model("mlp")
    assert choose_grad_sample_mode("auto", model, _DpSgd(), object(), per_user=True) == "bk"
    assert choose_grad_sample_mode("bk", model, _DpSgd(), object(), per_user=True) == "bk"


def test_a_batch_whose_user_rows_are_not_contiguous_is_refused():
    from dpbench.training.step import user_chunks

    x = torch.arange(6.0).unsqueeze(1)
    pieces = list(user_chunks(x, torch.tensor([2, 2, 5, 9, 9, 9]), 3))
    assert [p[1].tolist() for p in pieces] == [[2, 2, 5], [9, 9, 9]]
    for max_size in (None, 3):
        with pytest.raises(PrivacyError, match="not contiguous") as err:
            list(user_chunks(x, torch.tensor([2, 5, 2, 9, 9, 9]), max_size))
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("mode, message", [
    ("ghost", "layer Conv2d is called more than once in one forward"),
    ("bk", "layer 'layer' is called 2 times in one forward"),
])
def test_a_conv_called_twice_is_refused_per_user_in_one_line(mode, message):
    model = grid.CalledTwice(nn.Conv2d(3, 3, 3, padding=1))
    x, r = torch.randn(4, 3, 6, 6), torch.randn(4, 3, 6, 6)
    engine = build_engine(model, mode)
    with pytest.raises(ConfigError, match=message) as err:
        engine.clipped_user_sum(grid.loss_fn, (x, r), torch.tensor([1, 2, 1, 3]), ONE_POINT,
                                _clip(1.0))
    assert "\n" not in str(err.value)
    engine.close()
