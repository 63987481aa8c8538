"""Cyclic Poisson sampling (b-min-separation) for amplified banded matrix factorization.

Choquette-Choo et al. 2023 (BandMF, arXiv 2306.08153, Sec. 4): the N examples are split
into b fixed partitions, chosen before training and independently of the data; step t
Poisson-samples partition t mod b, each of its examples with probability b q (q = B / N), so
the expected batch is B and an example can take part only in steps b apart. With b = 1 the
only partition is the whole data set in its own order, and the draws are those of Opacus's
``UniformWithReplacementSampler`` (DP-SGD's sampler) for the same generator.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from opacus.data_loader import DPDataLoader, dtype_safe, shape_safe, wrap_collate_with_empty
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data._utils.collate import default_collate

from dpbench.utils.seeding import stream_seed


def fixed_partitions(dataset_size: int, bands: int, seed: np.random.SeedSequence | int
                     ) -> list[torch.Tensor]:
    """Return b disjoint index sets covering range(N), from a random permutation of ``seed``.

    The loop passes the run's ``partitions`` stream seed (``dpbench.utils.seeding``).

    b = 1 returns range(N) itself (no permutation), so one partition matches DP-SGD's sampler.
    """
    if bands == 1:
        return [torch.arange(dataset_size)]
    perm = np.random.default_rng(seed).permutation(dataset_size)
    return [torch.as_tensor(np.sort(part), dtype=torch.long)
            for part in np.array_split(perm, bands)]


class CyclicPoissonSampler(Sampler[list[int]]):
    """Yields ``steps`` batches per epoch; step t samples partition t mod b at rate b q."""

    def __init__(self, partitions: list[torch.Tensor], sample_rate: float, steps: int,
                 generator: torch.Generator) -> None:
        self.partitions = partitions
        self.sample_rate = sample_rate  # per-example rate within its partition (b q)
        self.steps = steps
        self.generator = generator
        self.step = 0  # global step: which partition comes next (checkpointed)

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            part = self.partitions[self.step % len(self.partitions)]
            mask = torch.rand(len(part), generator=self.generator) < self.sample_rate
            self.step += 1
            yield part[mask].tolist()

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


def cyclic_poisson_loader(dataset: Dataset, sampler: CyclicPoissonSampler) -> DataLoader:
    """Return a DataLoader over ``sampler``'s batches that, like Opacus's, allows empty ones.

    Built as ``opacus.data_loader.DPDataLoader`` builds its own, sampler generator included
    (the DataLoader draws a base seed from it per epoch), so b = 1 replays DP-SGD's stream.
    """
    first = dataset[0]
    return DataLoader(dataset, batch_sampler=sampler, generator=sampler.generator,
                      collate_fn=wrap_collate_with_empty(
                          collate_fn=default_collate, batch_first=True, rand_on_empty=False,
                          sample_empty_shapes=[(0, *shape_safe(x)) for x in first],
                          dtypes=[dtype_safe(x) for x in first]))


def training_loader(dataset: Dataset, plan: Any, seed: int, generator: torch.Generator,
                    cyclic: bool) -> tuple[DataLoader, CyclicPoissonSampler | None]:
    """Return the run's training loader (and its cyclic sampler, whose state is checkpointed).

    Plain Poisson sampling at rate q through Opacus's ``DPDataLoader`` (the sampler the
    accountant assumes), or, when the method asks for bands (``cyclic``), cyclic Poisson over
    ``plan.bands`` fixed partitions at rate b q, drawn from the run's ``sampler`` stream.
    """
    if not cyclic:
        return DPDataLoader(dataset, sample_rate=plan.sample_rate, generator=generator), None
    sampler = CyclicPoissonSampler(
        fixed_partitions(len(dataset), plan.bands, stream_seed(seed, "partitions")),
        plan.bands * plan.sample_rate, plan.steps_per_epoch, generator)
    return cyclic_poisson_loader(dataset, sampler), sampler


def remaining_batches(loader: DataLoader, generator: torch.Generator, done: int,
                      steps_per_epoch: int) -> Iterator[Any]:
    """Return an epoch's batches after the first ``done`` (all of them when ``done`` is 0).

    Mid-epoch (a resumed, preempted run), the sampling stream is put back after the loader's
    iterator takes its per-epoch draw, so the remaining masks are those a run never stopped
    draws.
    """
    if not done:
        return iter(loader)
    saved = generator.get_state()
    batches = iter(loader)
    generator.set_state(saved)
    return itertools.islice(batches, max(steps_per_epoch - done, 0))
