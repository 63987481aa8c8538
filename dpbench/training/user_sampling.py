"""User-level batches (``privacy.unit=user``): the per-user cap and the two samplers.

Charles et al. (2024), "Fine-Tuning Large Language Models with User-Level Differential
Privacy", Sec. 3 compare two ways to bound a user's contribution:

- **ULS** (user-level sampling): each step takes every user with probability q (Poisson over
  the U users, q = B / U, B the expected number of users a step) and all of the user's kept
  examples; the engine clips each user's gradient sum to C (``engine/per_user.py``). A step is
  DP-SGD over users: ``PoissonSampled(q, Gaussian(sigma))`` with the user as the unit.
- **ELS** (example-level sampling): each step takes every kept example with probability q
  (Poisson over the capped data set, q = B / N_k) and clips each example to C; a user with k
  kept examples contributes Binomial(k, q) of them, so a step is the mixture-of-Gaussians
  event (sensitivities 0..k with binomial weights).

**The cap** (``dpbench.data.users.capped_indices``): both keep at most
k = ``privacy.max_examples_per_user`` examples of each user, chosen ONCE before training from
sub-stream 1 of the run's ``user_partition`` stream (a uniformly random k of a user's rows,
the same for every step). The choice depends on the user ids only, never on the records'
values, so it is data-independent; a user with at most k examples keeps them all. The
declared choice is recorded in results.json (``user_level.cap``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from opacus.data_loader import dtype_safe, shape_safe, wrap_collate_with_empty
from torch.utils.data import DataLoader, Dataset, Sampler, Subset
from torch.utils.data._utils.collate import default_collate

#: how the k examples of a user over the cap are chosen (the only choice offered)
CAP_CHOICE = "uniform_random_once"


def user_groups(users: np.ndarray | torch.Tensor, rows: np.ndarray) -> list[torch.Tensor]:
    """Return, for each user (ascending id), the rows of ``rows`` that belong to it."""
    users = np.asarray(users, dtype=np.int64)[rows]
    order = np.argsort(users, kind="stable")
    _, starts = np.unique(users[order], return_index=True)
    bounds = [*starts.tolist(), len(order)]
    return [torch.as_tensor(rows[order[a:b]], dtype=torch.long)
            for a, b in zip(bounds, bounds[1:])]


@dataclass(frozen=True)
class UserFacts:
    """What results.json records of the user partition and the cap (all public: sizes)."""

    strategy: str
    max_examples_per_user: int
    users: int
    examples: int  # training examples before the cap
    kept_examples: int  # after the cap
    capped_users: int  # users that had more than k examples
    cap: str = CAP_CHOICE

    def record(self) -> dict[str, Any]:
        return dict(self.__dict__)


def user_facts(strategy: str, users: np.ndarray | torch.Tensor, k: int,
               kept: np.ndarray) -> UserFacts:
    """Return the facts of a partition ``users`` capped at ``k`` (``kept`` its kept rows)."""
    users = np.asarray(users, dtype=np.int64)
    _, counts = np.unique(users, return_counts=True)
    return UserFacts(strategy, int(k), int(len(counts)), int(len(users)), int(len(kept)),
                     int((counts > k).sum()))


class UserPoissonSampler(Sampler[list[int]]):
    """ULS: ``steps`` batches an epoch; each takes every user with probability ``rate`` and
    all of its kept rows, a user's rows contiguous (so a physical chunk never splits one)."""

    def __init__(self, groups: list[torch.Tensor], rate: float, steps: int,
                 generator: torch.Generator) -> None:
        self.groups, self.rate, self.steps, self.generator = groups, rate, steps, generator

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            mask = torch.rand(len(self.groups), generator=self.generator) < self.rate
            chosen = [self.groups[u] for u in mask.nonzero().flatten().tolist()]
            yield torch.cat(chosen).tolist() if chosen else []

    def state_dict(self) -> None:
        return None  # each batch is a fresh draw: the stream's state is the whole state

    def load_state_dict(self, state: Any) -> None:
        return None


class WithUsers(Dataset):
    """Row i of ``dataset`` paired with its user id (the ULS loader's items)."""

    def __init__(self, dataset: Dataset, users: torch.Tensor) -> None:
        self.dataset, self.users = dataset, users

    def __len__(self) -> int:
        return len(self.users)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return self.dataset[i], int(self.users[i])


def user_loader(dataset: Dataset, users: torch.Tensor, sampler: UserPoissonSampler
                ) -> DataLoader:
    """Return the ULS loader: batches ``(rows, user ids)``; an empty step yields empty rows
    (as Opacus's Poisson loader does) and an empty id tensor."""
    first = dataset[0]
    inner = wrap_collate_with_empty(
        collate_fn=default_collate, batch_first=True, rand_on_empty=False,
        sample_empty_shapes=[(0, *shape_safe(x)) for x in first],
        dtypes=[dtype_safe(x) for x in first])

    def collate(items: list[tuple[Any, int]]) -> tuple[Any, torch.Tensor]:
        return (inner([row for row, _ in items]),
                torch.tensor([u for _, u in items], dtype=torch.int64))

    return DataLoader(WithUsers(dataset, users), batch_sampler=sampler,
                      generator=sampler.generator, collate_fn=collate)


def uls_loader(dataset: Dataset, users: torch.Tensor, kept: np.ndarray, rate: float,
               steps: int, generator: torch.Generator
               ) -> tuple[DataLoader, UserPoissonSampler]:
    """Return the ULS loader over the capped rows ``kept`` and its sampler."""
    sampler = UserPoissonSampler(user_groups(users, kept), rate, steps, generator)
    return user_loader(dataset, torch.as_tensor(np.asarray(users), dtype=torch.int64),
                       sampler), sampler


def els_dataset(dataset: Dataset, kept: np.ndarray) -> Dataset:
    """Return the ELS training set: the capped rows (plain example-level Poisson runs on it)."""
    return Subset(dataset, kept.tolist())
