"""The run's batch samplers (``trainer.sampler``), one registry, one interface.

Every sampler is a batch sampler over range(N) drawing from the run's ``sampler`` stream,
with ``state_dict`` / ``load_state_dict`` (``None`` where the stream's state is all there is),
so the loop, the distributed sharding (``ShardedBatchSampler`` slices each global batch),
preemption and resume use them alike. Each has its accountant in ``dpbench.privacy.samplers``
(docs/sampling.md). ``poisson`` (the default) is Opacus's ``DPDataLoader``: each example with
probability q = B / N, the sampler the accountant assumes. The others (``fixed_size``,
``shuffle``, and cyclic Poisson when the method asks for bands) are in ``batch_samplers.py``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
from opacus.data_loader import DPDataLoader
from torch.utils.data import DataLoader, Dataset, Sampler

from dpbench.registry import Registry
from dpbench.training.batch_samplers import (
    CyclicPoissonSampler,
    cyclic_loader,
    fixed_size_loader,
    shuffle_loader,
)

#: name -> ``build(dataset, plan, seed, generator) -> (loader, stateful sampler or None)``
SAMPLERS: Registry[Any] = Registry("sampler")


@SAMPLERS.register("poisson")
def poisson_loader(dataset: Dataset, plan: Any, seed: int, generator: torch.Generator,
                   cyclic: bool = False) -> tuple[DataLoader, CyclicPoissonSampler | None]:
    """Plain Poisson sampling at rate q through Opacus's ``DPDataLoader`` (the sampler the
    accountant assumes), or, when the method asks for bands (``cyclic``), cyclic Poisson over
    ``plan.bands`` fixed partitions at rate b q (``batch_samplers.cyclic_loader``)."""
    if not cyclic:
        return DPDataLoader(dataset, sample_rate=plan.sample_rate, generator=generator), None
    return cyclic_loader(dataset, plan, seed, generator)


SAMPLERS.register("fixed_size")(fixed_size_loader)
SAMPLERS.register("shuffle")(shuffle_loader)


def training_loader(dataset: Dataset, plan: Any, seed: int, generator: torch.Generator,
                    cyclic: bool) -> tuple[DataLoader, Sampler[list[int]] | None]:
    """Return the run's training loader and its batch sampler where that has state to
    checkpoint: ``plan.sampling.sampler``'s entry of ``SAMPLERS``, drawing from the run's
    ``sampler`` stream (``generator``)."""
    return SAMPLERS.get(plan.sampling.sampler)(dataset, plan, seed, generator, cyclic)


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
