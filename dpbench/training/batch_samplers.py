"""The batch samplers other than plain Poisson, each drawing from the run's ``sampler`` stream.

``sampling.py`` dispatches ``trainer.sampler`` to them; each has its accountant in
``dpbench.privacy.samplers`` (docs/sampling.md):

- ``fixed_size``: each step exactly B distinct examples, uniformly without replacement;
- ``shuffle``: one uniform permutation per epoch cut into consecutive batches of exactly B
  (the last N - T B examples of the permutation sit the epoch out);
- cyclic Poisson sampling (b-min-separation) for amplified banded matrix factorization
  (Choquette-Choo et al. 2023, BandMF, arXiv 2306.08153, Sec. 4): the N examples are split
  into b fixed partitions, chosen before training and independently of the data; step t
  Poisson-samples partition t mod b, each of its examples with probability b q (q = B / N), so
  the expected batch is B and an example can take part only in steps b apart. With b = 1 the
  only partition is the whole data set in its own order, and the draws are those of Opacus's
  ``UniformWithReplacementSampler`` (DP-SGD's sampler) for the same generator.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from opacus.data_loader import dtype_safe, shape_safe, wrap_collate_with_empty
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


class FixedSizeSampler(Sampler[list[int]]):
    """Yields ``steps`` batches of exactly B distinct indices, each uniform without replacement
    (the first B of a fresh uniform permutation of range(N))."""

    def __init__(self, dataset_size: int, batch_size: int, steps: int,
                 generator: torch.Generator) -> None:
        if not 1 <= batch_size <= dataset_size:
            raise ValueError(f"batch size {batch_size} must be in [1, N = {dataset_size}]")
        self.n, self.batch_size, self.steps, self.generator = (
            dataset_size, batch_size, steps, generator)

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            yield torch.randperm(self.n, generator=self.generator)[:self.batch_size].tolist()

    def state_dict(self) -> dict[str, Any]:
        return {}  # each batch is a fresh draw: the stream's state is the whole state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


class ShuffleSampler(Sampler[list[int]]):
    """One uniform permutation of range(N) per epoch, cut into ``steps`` batches of exactly B.

    The epoch's permutation and the position in it are checkpointed, so a run resumed
    mid-epoch finishes the same permutation; the next epoch draws a new one.
    """

    def __init__(self, dataset_size: int, batch_size: int, steps: int,
                 generator: torch.Generator) -> None:
        if steps * batch_size > dataset_size:
            raise ValueError(f"{steps} batches of {batch_size} exceed N = {dataset_size}")
        self.n, self.batch_size, self.steps, self.generator = (
            dataset_size, batch_size, steps, generator)
        self.permutation: torch.Tensor | None = None
        self.position = 0  # batches of this epoch's permutation already yielded

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        if self.permutation is None or self.position >= self.steps:
            self.permutation = torch.randperm(self.n, generator=self.generator)
            self.position = 0
        while self.position < self.steps:
            start = self.position * self.batch_size
            self.position += 1
            yield self.permutation[start:start + self.batch_size].tolist()

    def state_dict(self) -> dict[str, Any]:
        return {"permutation": None if self.permutation is None else self.permutation.tolist(),
                "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        perm = state["permutation"]
        self.permutation = None if perm is None else torch.as_tensor(perm, dtype=torch.long)
        self.position = int(state["position"])


def cyclic_poisson_loader(dataset: Dataset, sampler: Sampler[list[int]]) -> DataLoader:
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


#: the loader over any batch sampler of this module (empty batches allowed)
batch_loader = cyclic_poisson_loader


def cyclic_loader(dataset: Dataset, plan: Any, seed: int, generator: torch.Generator
                  ) -> tuple[DataLoader, CyclicPoissonSampler]:
    """Cyclic Poisson over ``plan.bands`` fixed partitions at rate b q (the partitions from
    the run's ``partitions`` stream; the sampler's state is checkpointed)."""
    sampler = CyclicPoissonSampler(
        fixed_partitions(len(dataset), plan.bands, stream_seed(seed, "partitions")),
        plan.bands * plan.sample_rate, plan.steps_per_epoch, generator)
    return cyclic_poisson_loader(dataset, sampler), sampler


def fixed_size_loader(dataset: Dataset, plan: Any, seed: int, generator: torch.Generator,
                      cyclic: bool = False) -> tuple[DataLoader, FixedSizeSampler]:
    """Exactly B examples per step, without replacement (``FixedSizeSampler``)."""
    sampler = FixedSizeSampler(len(dataset), plan.sampling.batch_size, plan.steps_per_epoch,
                               generator)
    return batch_loader(dataset, sampler), sampler


def shuffle_loader(dataset: Dataset, plan: Any, seed: int, generator: torch.Generator,
                   cyclic: bool = False) -> tuple[DataLoader, ShuffleSampler]:
    """A permutation per epoch in batches of exactly B (``ShuffleSampler``)."""
    sampler = ShuffleSampler(len(dataset), plan.sampling.batch_size, plan.steps_per_epoch,
                             generator)
    return batch_loader(dataset, sampler), sampler
