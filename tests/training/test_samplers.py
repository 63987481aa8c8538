"""Each batch sampler draws what its definition says (counts per example per epoch, batch
sizes), is sliced per rank into the one global batch, and resumes mid-epoch to the batches of
a run never stopped; K = 2 torchrun processes give the 1-process run's epsilon and ledger."""

from __future__ import annotations

import json
import subprocess
from collections import Counter

import numpy as np
import pytest
import torch
from opacus.utils.uniform_sampler import UniformWithReplacementSampler

from dpbench.experiment import build_trainer
from dpbench.privacy.samplers import SAMPLERS as ACCOUNTED
from dpbench.training.batch_samplers import FixedSizeSampler, ShuffleSampler
from dpbench.training.checkpoint import load_checkpoint
from dpbench.training.distributed import Collective, ShardedBatchSampler
from dpbench.training.preemption import Preempted
from dpbench.training.sampling import SAMPLERS
from tests.helpers.config import compose_config
from tests.helpers.distributed import torchrun_command as _torchrun
from tests.helpers.distributed import torchrun_env as _env

pytestmark = pytest.mark.integration  # whole runs or processes: make test, not test-quick

N, B = 500, 20
STEPS = N // B  # steps per epoch, as the plan sets them


def _gen(seed: int = 3) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_every_accounted_sampler_has_a_loader_and_no_other():
    assert sorted(SAMPLERS.names()) == sorted(ACCOUNTED)


def test_fixed_size_draws_exactly_b_distinct_and_each_example_at_rate_b_over_n():
    epochs = 40
    sampler = FixedSizeSampler(N, B, STEPS, _gen())
    counts = Counter()
    for _ in range(epochs):
        for batch in sampler:
            assert len(batch) == B == len(set(batch)) and all(0 <= i < N for i in batch)
            counts.update(batch)
    total = epochs * STEPS
    p = B / N  # each step includes a given example with probability exactly B / N
    sd = np.sqrt(total * p * (1 - p))
    per_example = np.array([counts[i] for i in range(N)])
    assert np.all(np.abs(per_example - total * p) <= 6 * sd)  # binomial(T, B/N)
    assert abs(per_example.mean() - total * p) < 1e-9  # exactly B per step in all


def test_shuffle_draws_each_example_at_most_once_per_epoch_in_batches_of_b():
    sampler = ShuffleSampler(N + 7, B, STEPS, _gen())  # N + 7: 7 sit each epoch out
    epochs = [list(sampler) for _ in range(5)]
    for batches in epochs:
        assert len(batches) == STEPS and all(len(b) == B for b in batches)
        flat = [i for b in batches for i in b]
        assert len(flat) == len(set(flat)) == STEPS * B  # once each, the tail never
    assert epochs[0] != epochs[1]  # a new permutation each epoch


def test_poisson_draws_each_example_at_rate_q():
    q, steps = B / N, 400
    sampler = UniformWithReplacementSampler(num_samples=N, sample_rate=q, generator=_gen(),
                                            steps=steps)
    counts, sizes = Counter(), []
    for batch in sampler:
        counts.update(batch.tolist() if hasattr(batch, "tolist") else batch)
        sizes.append(len(batch))
    sd = np.sqrt(steps * q * (1 - q))
    assert all(abs(counts[i] - steps * q) <= 6 * sd for i in range(N))
    assert abs(np.mean(sizes) - B) <= 6 * np.sqrt(N * q * (1 - q) / steps)


@pytest.mark.parametrize("cls", [FixedSizeSampler, ShuffleSampler])
def test_the_ranks_slices_partition_each_global_batch(cls):
    one = list(cls(N, B, STEPS, _gen(7)))
    slices = [list(ShardedBatchSampler(cls(N, B, STEPS, _gen(7)), Collective(r, 2)))
              for r in range(2)]
    for t, batch in enumerate(one):
        parts = [s[t] for s in slices]
        assert sorted(parts[0] + parts[1]) == sorted(batch) and len(parts[0]) == B // 2


def test_shuffle_resumed_mid_epoch_yields_the_rest_of_the_same_permutation():
    ref = ShuffleSampler(N, B, STEPS, _gen())
    ref_epochs = [list(ref) for _ in range(2)]
    run = ShuffleSampler(N, B, STEPS, _gen())
    it = iter(run)
    first = [next(it) for _ in range(5)]
    state, g_state = run.state_dict(), run.generator.get_state()
    resumed = ShuffleSampler(N, B, STEPS, _gen(99))
    resumed.load_state_dict(state)
    resumed.generator.set_state(g_state)
    assert first + list(resumed) == ref_epochs[0]
    assert list(resumed) == ref_epochs[1]


RUN = ["dataset=digits", "model=mlp", "trainer.epochs=2", "trainer.batch_size=128",
       "trainer.num_threads=1", "trainer.grad_sample_mode=bk"]
ACCOUNTANT = {"poisson": "pld", "fixed_size": "rdp", "shuffle": "pld"}


def _overrides(sampler: str) -> list[str]:
    return [*RUN, f"trainer.sampler={sampler}", f"privacy.accountant={ACCOUNTANT[sampler]}"]


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["fixed_size", "shuffle"])
def test_a_run_preempted_mid_epoch_resumes_to_the_uninterrupted_result(tmp_path, sampler):
    ref = build_trainer(compose_config(*_overrides(sampler)), tmp_path / "ref").fit()
    run_dir = tmp_path / "run"
    calls = iter(range(10**6))
    with pytest.raises(Preempted):
        build_trainer(compose_config(*_overrides(sampler)), run_dir).fit(
            stop=lambda: next(calls) == 4)  # after step 5 of 11: mid-epoch
    got = build_trainer(compose_config(*_overrides(sampler), "trainer.resume=true"),
                        run_dir).fit()
    assert got["steps"] == ref["steps"] and got["epsilon"] == ref["epsilon"]
    assert got["privacy_ledger"] == ref["privacy_ledger"]
    one, two = (load_checkpoint(d / "checkpoint.pt") for d in (tmp_path / "ref", run_dir))
    for name, value in one["model"].items():
        assert torch.equal(two["model"][name], value), name
    assert got["sampler"] == sampler and got["neighbouring"] == "replace_one"
    assert got["epsilon_if_poisson"] < got["epsilon"]


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["poisson", "fixed_size", "shuffle"])
def test_two_ranks_give_the_one_process_epsilon_and_batches(tmp_path, sampler):
    overrides = _overrides(sampler)
    two = tmp_path / "two"
    proc = subprocess.run(_torchrun(overrides, two), capture_output=True, text=True,
                          timeout=600, env=_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads((two / "results.json").read_text())
    ref = build_trainer(compose_config(*overrides), tmp_path / "one").fit()
    assert got["world_size"] == 2 and got["steps"] == ref["steps"]
    assert got["epsilon"] == ref["epsilon"] and got["sampler"] == sampler
    assert got["privacy_ledger"] == ref["privacy_ledger"]
    two_ck = load_checkpoint(two / "checkpoint.pt")
    one_ck = load_checkpoint(tmp_path / "one" / "checkpoint.pt")
    # the same batches: the sampling stream and the sampler's own state end alike
    assert torch.equal(two_ck["generators"]["sampler"], one_ck["generators"]["sampler"])
    assert two_ck["sampler"] == one_ck["sampler"]
