"""User-level batches: the per-user cap is uniform over a user's rows, and Poisson sampling
over users (ULS) takes whole users at rate q (the cap's other properties:
tests/data/test_users.py)."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats
from torch.utils.data import TensorDataset

from dpbench.data.users import capped_indices
from dpbench.training.user_sampling import (
    UserPoissonSampler,
    uls_loader,
    user_facts,
    user_groups,
)

USERS = np.array([5, 2, 5, 5, 9, 2, 5, 5, 1, 5, 9, 5])  # user 5 has 7 rows, 2 and 9 two, 1 one


def test_the_cap_is_uniform_over_a_users_rows():
    """Each of user 5's 7 rows is kept with probability 3/7 (binomial test over 700 seeds)."""
    rows5 = np.flatnonzero(USERS == 5)
    hits = np.zeros(len(rows5))
    trials = 700
    for s in range(trials):
        kept = set(capped_indices(USERS, 3, s).tolist())
        hits += [r in kept for r in rows5]
    for h in hits:
        assert stats.binomtest(int(h), trials, 3 / 7).pvalue > 1e-4


def test_facts_count_users_and_the_capped():
    kept = capped_indices(USERS, 3, 0)
    f = user_facts("uls", USERS, 3, kept)
    assert (f.users, f.examples, f.kept_examples, f.capped_users) == (4, 12, 8, 1)


def test_uls_batches_are_whole_users_at_rate_q():
    kept = capped_indices(USERS, 3, 0)
    groups = user_groups(USERS, kept)
    assert [int(USERS[g[0]]) for g in groups] == [1, 2, 5, 9]
    sampler = UserPoissonSampler(groups, 0.3, 4000, torch.Generator().manual_seed(0))
    counts = np.zeros(4)
    for batch in sampler:
        present = set(USERS[batch].tolist()) if batch else set()
        for j, u in enumerate([1, 2, 5, 9]):
            rows = [r for r in batch if USERS[r] == u]
            assert rows == [] or sorted(rows) == sorted(groups[j].tolist())  # whole users
            counts[j] += u in present
        # a user's rows are contiguous in the batch (a chunk never splits one)
        ids = USERS[batch].tolist()
        assert all(ids.index(u) + ids.count(u) - 1 == len(ids) - 1 - ids[::-1].index(u)
                   for u in set(ids))
    for c in counts:
        assert stats.binomtest(int(c), 4000, 0.3).pvalue > 1e-4


def test_the_uls_loader_hands_rows_with_their_users_and_empty_steps():
    x = torch.arange(12, dtype=torch.float32).view(12, 1)
    y = torch.zeros(12, dtype=torch.long)
    users = torch.as_tensor(USERS)
    kept = capped_indices(USERS, 3, 0)
    loader, _ = uls_loader(TensorDataset(x, y), users, kept, 0.5, 50,
                           torch.Generator().manual_seed(1))
    empty = 0
    for (bx, by), bu in loader:
        assert bu.dtype == torch.int64 and len(bu) == len(bx) == len(by)
        assert torch.equal(users[bx.flatten().long()], bu)
        empty += len(bu) == 0
    assert empty > 0  # (1/2)^4 of the steps draw no user: an empty batch, still released
