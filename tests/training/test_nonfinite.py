"""Non-finite examples are dropped everywhere; only released quantities decide skip or stop."""

from __future__ import annotations

import math

import pytest
import torch

from dpbench.experiment import build_trainer
from dpbench.methods import get_method
from dpbench.methods.base import StepContext
from dpbench.models import get_model_builder
from dpbench.tasks import get_task
from dpbench.training.engine.choice import build_engine
from dpbench.training.step import plan_at, private_release
from tests.helpers.config import compose_config
from tests.helpers.wrapped import build_wrapped, poisoned_at

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

RUN = ("model.hidden=16", "trainer.batch_size=64", "trainer.epochs=2")
BAD_ROWS = (3, 11)  # rows of the step-level batch whose features are NaN


def _batch(n: int = 24, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 8, 8, generator=gen) * 5
    y = torch.randint(0, 10, (n,), generator=gen)
    bad = x.clone()
    bad[list(BAD_ROWS), 0, 2, 3] = math.nan
    keep = [i for i in range(n) if i not in BAD_ROWS]
    return (bad, y), (x[keep], y[keep])


def _release(method_name: str, mode: str, batch, seed: int = 5):
    torch.manual_seed(0)
    net = get_model_builder("mlp")((1, 8, 8), 10)
    engine = build_engine(net, mode)
    halves = get_method(method_name).configured(lambda p: torch.optim.SGD(p, lr=0.1)).halves()
    method = halves.mechanism
    ctx = StepContext(step=0, epoch=0, private=True, noise_multiplier=1.0, clip_norm=0.5,
                      expected_batch_size=24.0, sample_rate=0.1, dataset_size=240,
                      total_steps=10)
    if method_name == "adaclip":
        from dpbench.methods.base import RunInfo

        halves.setup(list(net.parameters()), RunInfo(
            dataset_size=240, expected_batch_size=24.0, sample_rate=0.1, total_steps=10,
            noise_multiplier=1.0, clip_norm=0.5, private=True, task="classification",
            device=torch.device("cpu")))
    plan = plan_at(method, 1.0, 24.0)
    ctx.noise_std = plan.released_noise_std(method.sensitivity(ctx))
    return private_release(method, engine, get_task("classification")(), batch, ctx, plan, None,
                           noise=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
@pytest.mark.parametrize("method", ["dpsgd", "adaclip"])
def test_a_nan_example_releases_exactly_what_its_absence_releases(method, mode):
    """Same noise, the NaN rows present or removed: the same release, queries and losses."""
    poisoned, clean = _batch()
    got = _release(method, mode, poisoned)
    ref = _release(method, "hooks", clean)
    for a, b in zip(got.grads, ref.grads):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert got.noisy_extras.keys() == ref.noisy_extras.keys()
    for name in ref.noisy_extras:  # a dropped example makes no extra query either
        torch.testing.assert_close(got.noisy_extras[name], ref.noisy_extras[name])
    assert torch.isfinite(got.losses).all() and len(got.losses) == len(ref.losses)
    torch.testing.assert_close(got.losses, ref.losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.norms, ref.norms, rtol=1e-4, atol=1e-6)


def test_ghost_release_with_a_nan_example_equals_hooks_release():
    poisoned, _ = _batch()
    ghost = _release("dpsgd", "ghost", poisoned, seed=9)
    hooks = _release("dpsgd", "hooks", poisoned, seed=9)
    for a, b in zip(ghost.grads, hooks.grads):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def _poison_records(trainer, rows):
    x = trainer.data.train.tensors[0]
    x[list(rows), 0, 4, 4] = math.nan


@pytest.mark.parametrize("nonfinite", ["stop", "skip"])
def test_nan_records_never_skip_or_stop_and_the_loss_is_the_finite_mean(nonfinite):
    trainer = build_trainer(compose_config(*RUN, f"trainer.nonfinite={nonfinite}"), None)
    n = len(trainer.data.train)
    bad = list(range(0, n, 10))  # 10% NaN records: about 6 in each batch of 64
    _poison_records(trainer, bad)
    losses: list[tuple[float, float, bool]] = []
    train_step = trainer.train_step

    def checked_step(batch):
        with torch.no_grad():
            per_example = trainer.task.per_example_loss(trainer.model, batch)
        finite = per_example[torch.isfinite(per_example)]
        metrics = train_step(batch)
        losses.append((metrics["unprivatised"]["loss"], float(finite.mean()),
                       len(finite) < len(per_example)))
        return metrics

    trainer.train_step = checked_step
    result = trainer.fit()
    assert result["skipped_steps"] == 0
    assert result["steps"] == result["planned_steps"]
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert math.isfinite(result["metrics"]["accuracy"])
    assert len(losses) == result["steps"]
    assert sum(had_nan for *_, had_nan in losses) > 0.9 * len(losses)
    for logged, expected, _ in losses:
        assert logged == pytest.approx(expected, rel=1e-5)


def test_a_non_finite_update_is_skipped_from_released_quantities_and_restored():
    """The optimiser (post-processing) turns the weights NaN: skip restores the model."""
    trainer = build_wrapped(compose_config(*RUN, "trainer.nonfinite=skip"),
                            update=poisoned_at({2, 5}))
    before: dict[int, list[torch.Tensor]] = {}
    train_step = trainer.train_step

    def recording(batch):
        before[trainer.step] = [p.detach().clone() for p in trainer.params]
        return train_step(batch)

    trainer.train_step = recording
    result = trainer.fit()
    assert result["skipped_steps"] == 2
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    for a, b in zip(before[3], before[2]):  # step 2 left the weights as they were
        assert torch.equal(a, b)


class _PointLoss:
    """A loss that is NaN for rows 1 and 4 at the second evaluation point only."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, model, batch):
        x, y = batch
        losses = torch.nn.functional.cross_entropy(model(x), y, reduction="none")
        self.calls += 1
        if self.calls % 2 == 0:  # the second point of each two-point call
            mask = torch.zeros_like(losses, dtype=torch.bool)
            mask[[1, 4]] = True
            # NaN in the value only: its gradient stays that of the finite loss, so only the
            # rule on the losses (not a NaN norm) can drop the example
            losses = losses + torch.where(mask, math.nan, 0.0).to(losses.dtype)
        return losses


@pytest.mark.parametrize("mode", ["bk", "hooks", "functorch"])
def test_every_engine_drops_an_example_non_finite_at_any_point(mode):
    """The drop rule of the engine protocol (``kept_examples``): a loss that is non-finite at
    one of two evaluation points drops the example from the clipped sum, for every engine,
    and the sum equals that of the other examples alone."""
    from dpbench.methods.base import EvalPoint

    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(),
                              torch.nn.Linear(4, 3)).double()  # against a float64 reference
    x, y = torch.randn(6, 5, dtype=torch.float64), torch.randint(0, 3, (6,))
    engine = build_engine(net, mode)
    offsets = [0.01 * torch.ones_like(p) for p in engine.params]
    points = [EvalPoint(0.5), EvalPoint(0.5, offsets)]
    got = engine.clipped_sum(_PointLoss(), (x, y), points, torch.ones_like)
    assert got.kept.tolist() == [True, False, True, True, False, True]
    assert got.norms[[1, 4]].eq(0).all() and got.factors[[1, 4]].eq(0).all()
    keep = torch.tensor([0, 2, 3, 5])
    plain = torch.nn.functional.cross_entropy
    ref = [torch.zeros_like(p) for p in engine.params]
    for point in points:  # sum_i (w_1 g_i(theta) + w_2 g_i(theta + delta)) over kept rows
        with torch.no_grad():
            for p, d in zip(engine.params, point.offsets or [0.0] * len(ref)):
                p.add_(d)
        loss = plain(net(x[keep]), y[keep], reduction="sum")
        grads = torch.autograd.grad(loss, engine.params)
        with torch.no_grad():
            for p, d in zip(engine.params, point.offsets or [0.0] * len(ref)):
                p.sub_(d)
        ref = [r + point.weight * g for r, g in zip(ref, grads)]
    tol = 1e4 * torch.finfo(torch.float64).eps
    for a, b in zip(got.sums, ref):
        assert torch.allclose(a, b, rtol=tol, atol=tol)
    engine.close()
