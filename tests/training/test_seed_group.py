"""``trainer.seeds_at_once``: K seeds trained together are K separate runs (seed_group.py).

Each seed of a group must have exactly what a separate run of that seed has: the same
Poisson batches (its own sampler stream), the same noise (its own noise stream), hence the
same parameters step by step (to a float32 tolerance: the group computes per-example
gradients by ``vmap``, a separate run by book-keeping), the same ledger and epsilon.
"""

from __future__ import annotations

import pytest
import torch

from dpbench.experiment import build_trainer
from dpbench.training.seed_group import (
    SeedGroup,
    epoch_batches,
    fit_group,
    group_engines,
    grouping_refusal,
)
from tests.helpers.config import compose_config
from tests.helpers.synthetic import write_mnist_copy

SEEDS = (0, 1, 2)
STEPS = 10
#: parameters of a group and of separate runs agree to this many float32 epsilons (relative
#: to the parameters' scale): per-example gradients by two engines differ in rounding only
ULPS = 512
TOLERANCE = ULPS * torch.finfo(torch.float32).eps


@pytest.fixture(scope="module")
def mnist_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("seed-group-data")
    write_mnist_copy(root, n=200)
    return root


def _overrides(model: str, root) -> list[str]:
    if model == "cnn2":  # 28x28 images: a synthetic MNIST copy (no download)
        return ["model=cnn2", "dataset=mnist", f"paths.data_root={root}",
                "dataset.download=false", "trainer.batch_size=16", "trainer.epochs=2",
                "method.optimizer.lr=0.1"]
    return [f"model={model}", "trainer.batch_size=64"]


def _trainers(overrides: list[str], seeds=SEEDS):
    return [build_trainer(compose_config(*overrides, "trainer.checkpoint=false", f"seed={s}"))
            for s in seeds]


class _Releases:
    """A callback keeping each release (the noisy gradient) of a run."""

    def __init__(self) -> None:
        self.grads: list[list[torch.Tensor]] = []

    def on_release(self, view, released) -> None:
        self.grads.append([g.detach().clone() for g in released.grads])


def _assert_same_as_separate(grouped, separate, steps: int, group: SeedGroup,
                             resync: bool = False) -> None:
    """Assert each grouped seed's releases and parameters equal its separate run's, step by
    step (``resync``: each step starts the separate run from the group's parameters)."""
    runs = [*grouped, *separate]
    releases = [_Releases() for _ in runs]
    for t, r in zip(runs, releases):
        t.callbacks.append(r)
        t.begin()
    g_iters = [t.epoch_batches() for t in grouped]
    s_iters = [t.epoch_batches() for t in separate]
    for step in range(steps):
        batches = [next(it) for it in g_iters]
        if resync:
            for g, s in zip(grouped, separate):
                with torch.no_grad():
                    for p, q in zip(s.params, g.params):
                        p.copy_(q)
        group.stage(batches, grouped[0].device)
        for t, b in zip(grouped, batches):
            t.end_step(t.train_step(b))
        group.unstage()
        for t, it in zip(separate, s_iters):
            t.end_step(t.train_step(next(it)))
        for k, (g, s) in enumerate(zip(grouped, separate)):
            assert _close(releases[len(grouped) + k].grads[step], releases[k].grads[step]), (
                f"seed {g.seed} step {step}: its release is not its separate run's")
            assert _close([p.detach() for p in s.params], [p.detach() for p in g.params]), (
                f"seed {g.seed} step {step}: parameters differ from its separate run")
    for g, s in zip(grouped, separate):
        assert g.step == s.step == steps
        assert g.ledger.to_json() == s.ledger.to_json()
        assert g.epsilon() == s.epsilon()


def _close(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    scale = max(1.0, *(float(x.abs().max()) for x in a))
    return all(torch.allclose(x, y, rtol=TOLERANCE, atol=TOLERANCE * scale)
               for x, y in zip(a, b))


@pytest.mark.parametrize("model", ["logreg", "mlp", "cnn2"])
def test_each_seed_equals_its_separate_run(model, mnist_root):
    overrides = _overrides(model, mnist_root)
    grouped, separate = _trainers(overrides), _trainers(overrides)
    group = group_engines(grouped)
    assert all(t.grad_sample_mode == "seed_group" for t in grouped)
    assert all(t.engine_checks[-1]["when"] == "grouped" for t in grouped)
    # cnn2's max-pooling is not differentiable where two inputs tie: a difference of one
    # rounding error in the weights can move a near-tie's arg max, and with it the gradient,
    # so its seeds are compared step by step from the same weights (same batch, same noise)
    _assert_same_as_separate(grouped, separate, STEPS, group, resync=model == "cnn2")


class _SharedBatch(SeedGroup):
    """Broken on purpose: every seed is handed the gradients of seed 0's batch (on both of
    the group's paths: the linear closed form and vmap)."""

    def per_example(self, k, loss_fn, batch):
        if self._staged is None:
            return super().per_example(k, loss_fn, batch)
        return self.compute([self._staged[0]] * self.size, loss_fn)[k]

    def linear_rows(self, k, loss_fn, batch):
        if self._staged is None:
            return super().linear_rows(k, loss_fn, batch)
        return self.linear_compute([self._staged[0]] * self.size, loss_fn)[k]


def test_the_privacy_check_catches_a_shared_batch_or_noise_draw():
    """The check above fails for a group whose seeds share a batch mask or a noise draw."""
    overrides = _overrides("mlp", None)
    # the real group passes, and no two seeds drew the same mask or the same noise
    grouped, separate = _trainers(overrides), _trainers(overrides)
    _assert_same_as_separate(grouped, separate, 3, group_engines(grouped))
    first = [t.ledger.to_json() for t in grouped]
    assert len({str(x) for x in first}) == 1  # the same plan: the masks differ, not the plan
    states = [t.noise_generator.get_state() for t in grouped]
    assert all(not torch.equal(a, b) for i, a in enumerate(states) for b in states[i + 1:])
    # seeds handed one batch: caught
    grouped, separate = _trainers(overrides), _trainers(overrides)
    broken = _SharedBatch([t.model for t in grouped])
    for k, t in enumerate(grouped):
        t.use_engine(broken.member(k), "grouped")  # the per-run check's rows pass
    with pytest.raises(AssertionError, match="release is not its separate run"):
        _assert_same_as_separate(grouped, separate, 3, broken)
    # seeds drawing one noise stream: caught
    grouped, separate = _trainers(overrides), _trainers(overrides)
    group = group_engines(grouped)
    for t in grouped[1:]:
        t.noise_generator = grouped[0].noise_generator
    with pytest.raises(AssertionError, match="release is not its separate run"):
        _assert_same_as_separate(grouped, separate, 3, group)


def test_each_seed_draws_its_own_batch_at_every_step():
    """A step's K batches are K different Poisson masks (never one batch for two seeds)."""
    trainers = _trainers(_overrides("mlp", None), seeds=range(4))
    iters = [t.epoch_batches() for t in trainers]
    for _ in range(5):
        batches = [next(it) for it in iters]
        for i in range(len(batches)):
            for j in range(i + 1, len(batches)):
                a, b = batches[i][0], batches[j][0]
                assert a.shape != b.shape or not torch.equal(a, b)


@pytest.mark.parametrize("done", [0, 4])
def test_the_groups_batches_are_the_loaders_batches(done):
    """The group's fetch by indexing yields the loader's own batches (the same masks from
    the same stream, the same tensors), over two epochs, from the start or mid-epoch."""
    overrides = [*_overrides("mlp", None), "trainer.batch_size=4"]  # empty batches occur
    ours, theirs = _trainers(overrides, seeds=[3]), _trainers(overrides, seeds=[3])
    for t in (*ours, *theirs):
        t.epoch_step = done
    empty = 0
    for _ in range(2):
        mine, loaders = list(epoch_batches(ours[0])), list(theirs[0].epoch_batches())
        assert len(mine) == len(loaders) == ours[0].plan.steps_per_epoch - done
        for a, b in zip(mine, loaders):
            assert len(a) == len(b)
            assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b))
            empty += len(a[0]) == 0
    assert empty  # an empty Poisson batch was among them
    assert torch.equal(ours[0].sampler_generator.get_state(),
                       theirs[0].sampler_generator.get_state())


def test_grouping_refuses_in_one_line_naming_what():
    common = dict(method="dpsgd", model="mlp", task="classification", private=True,
                  sampler="poisson", precision="32-true", grad_sample_mode="auto",
                  distributed=False)
    assert grouping_refusal(**common) is None
    for key, value, named in [("model", "resnet18", "model=resnet18"),
                              ("method", "dpadam", "method=dpadam"),
                              ("sampler", "shuffle", "shuffle"),
                              ("precision", "bf16-mixed", "bf16-mixed"),
                              ("grad_sample_mode", "ghost", "ghost"),
                              ("task", "generation", "generation"),
                              ("unit", "user", "privacy.unit=user")]:
        reason = grouping_refusal(**{**common, key: value})
        assert reason is not None and named in reason and "\n" not in reason


def test_a_group_resumes_from_its_seeds_checkpoints(tmp_path):
    """A group preempted after step 3 and resumed ends where an uninterrupted group ends."""
    overrides = [*_overrides("mlp", None), "trainer.epochs=1"]

    def trainers(folder):
        return [build_trainer(compose_config(*overrides, "trainer.resume=true", f"seed={s}"),
                              run_dir=tmp_path / folder / str(s)) for s in SEEDS]

    whole = trainers("whole")
    expected = fit_group(whole, group_engines(whole))
    first = trainers("cut")
    calls = iter(range(100))
    from dpbench.training.preemption import Preempted

    with pytest.raises(Preempted):
        fit_group(first, group_engines(first), stop=lambda: next(calls) >= 2)
    again = trainers("cut")
    results = fit_group(again, group_engines(again))
    assert all(t.checkpoint.resumed for t in again)
    for a, b in zip(expected, results):
        assert a["steps"] == b["steps"] and a["epsilon"] == b["epsilon"]
        assert a["metrics"]["accuracy"] == pytest.approx(b["metrics"]["accuracy"], abs=1e-6)


@pytest.mark.slow
def test_sixteen_grouped_seeds_agree_with_sixteen_separate_runs_in_accuracy(capsys):
    """The demo cell, 16 seeds: the final test accuracies of a group of 16 and of 16 separate
    runs are one distribution (Welch's two-sample t-test and Mann-Whitney U, both at 5 %)."""
    from scipy import stats

    overrides = ["trainer.checkpoint=false"]
    seeds = range(16)
    grouped = [build_trainer(compose_config(*overrides, f"seed={s}")) for s in seeds]
    together = [r["metrics"]["accuracy"] for r in fit_group(grouped, group_engines(grouped))]
    alone = [build_trainer(compose_config(*overrides, f"seed={s}")).fit()["metrics"]["accuracy"]
             for s in seeds]
    welch = stats.ttest_ind(together, alone, equal_var=False).pvalue
    rank = stats.mannwhitneyu(together, alone).pvalue
    with capsys.disabled():
        print(f"\n16 seeds: grouped mean accuracy {sum(together) / 16:.4f}, separate "
              f"{sum(alone) / 16:.4f}; Welch p = {welch:.3f}, Mann-Whitney p = {rank:.3f}")
    assert welch > 0.05 and rank > 0.05
