"""User-level batches: the per-user cap (data-independent, seeded, as declared) and
Poisson sampling over users (ULS)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats
from torch.utils.data import TensorDataset

from dpbench.training.user_sampling import (
    UserPoissonSampler,
    capped_rows,
    uls_loader,
    user_facts,
    user_groups,
)
from dpbench.utils.seeding import stream_seed

USERS = np.array([5, 2, 5, 5, 9, 2, 5, 5, 1, 5, 9, 5])  # user 5 has 7 rows, 2 and 9 two, 1 one


def test_a_user_over_the_cap_keeps_exactly_k_of_its_own_rows():
    kept = capped_rows(USERS, 3, stream_seed(0, "user_cap"))
    counts = {u: int((USERS[kept] == u).sum()) for u in np.unique(USERS)}
    assert counts == {1: 1, 2: 2, 5: 3, 9: 2}
    assert set(np.flatnonzero(USERS != 5)) <= set(kept.tolist())  # at most k: all kept
    assert list(kept) == sorted(kept)


def test_the_cap_is_seeded_and_depends_on_the_user_ids_only():
    a = capped_rows(USERS, 3, stream_seed(0, "user_cap"))
    b = capped_rows(USERS.copy(), 3, stream_seed(0, "user_cap"))
    assert np.array_equal(a, b)  # same ids, same seed: same rows (no record value read)
    seen = {tuple(capped_rows(USERS, 3, stream_seed(s, "user_cap"))) for s in range(20)}
    assert len(seen) > 1  # the choice is the stream's, not a fixed prefix


def test_the_cap_is_uniform_over_a_users_rows():
    """Each of user 5's 7 rows is kept with probability 3/7 (binomial test over 700 seeds)."""
    rows5 = np.flatnonzero(USERS == 5)
    hits = np.zeros(len(rows5))
    trials = 700
    for s in range(trials):
        kept = set(capped_rows(USERS, 3, s).tolist())
        hits += [r in kept for r in rows5]
    for h in hits:
        assert stats.binomtest(int(h), trials, 3 / 7).pvalue > 1e-4


def test_facts_count_users_and_the_capped():
    kept = capped_rows(USERS, 3, 0)
    f = user_facts("uls", USERS, 3, kept)
    assert (f.users, f.examples, f.kept_examples, f.capped_users) == (4, 12, 8, 1)


def test_uls_batches_are_whole_users_at_rate_q():
    kept = capped_rows(USERS, 3, 0)
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
    kept = capped_rows(USERS, 3, 0)
    loader, _ = uls_loader(TensorDataset(x, y), users, kept, 0.5, 50,
                           torch.Generator().manual_seed(1))
    empty = 0
    for (bx, by), bu in loader:
        assert bu.dtype == torch.int64 and len(bu) == len(bx) == len(by)
        assert torch.equal(users[bx.flatten().long()], bu)
        empty += len(bu) == 0
    assert empty > 0  # (1/2)^4 of the steps draw no user: an empty batch, still released


def test_a_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="max_examples_per_user"):
        capped_rows(USERS, 0, 0)
