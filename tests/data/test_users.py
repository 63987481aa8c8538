"""The user partition (``dpbench/data/users.py``): a declared, seeded synthetic partition and
a loader's user field, aligned with the training set, reading no record's content."""

from __future__ import annotations

import numpy as np
import pytest
from torch.utils.data import Dataset

from dpbench.data.base import TaskData
from dpbench.data.users import (
    MAX_USERS,
    RECORDS_PER_USER,
    USER_FIELDS,
    UsersConfig,
    capped_indices,
    declared_sizes,
    synthetic_user_ids,
    user_ids,
    user_sizes,
    users_config,
)
from dpbench.errors import ConfigError, DataError


class Unreadable(Dataset):
    """A training set of n records whose content may not be read."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        raise AssertionError("the user partition read a training record")


def _data(n: int, extras=None) -> TaskData:
    return TaskData("toy", "classification", Unreadable(n), Unreadable(3), extras=extras or {})


SYNTH = {"users": "synthetic", "num_users": 50, "user_sizes": "zipf", "zipf_exponent": 1.2}


def test_synthetic_partition_is_deterministic_for_a_seed_and_differs_for_another():
    a = user_ids(_data(1000), SYNTH, seed=3)
    assert a.dtype == np.int64 and a.shape == (1000,)
    assert np.array_equal(a, user_ids(_data(1000), SYNTH, seed=3))
    b = user_ids(_data(1000), SYNTH, seed=4)
    assert not np.array_equal(a, b)
    # the same declared sizes under both seeds: only who holds which records changes
    assert np.array_equal(np.sort(user_sizes(a)), np.sort(user_sizes(b)))


@pytest.mark.parametrize("n,users,s", [(1000, 50, 1.2), (1438, 143, 1.0), (60000, 600, 0.5),
                                       (97, 97, 2.0), (10, 1, 1.0)])
def test_sizes_follow_the_declared_zipf_distribution(n, users, s):
    config = UsersConfig(num_users=users, user_sizes="zipf", zipf_exponent=s)
    ids = synthetic_user_ids(n, config, seed=0)
    sizes = user_sizes(ids)
    assert len(sizes) == users and sizes.sum() == n and sizes.min() >= 1
    assert np.array_equal(sizes, declared_sizes(n, users, "zipf", s))  # user r - 1 holds n_r
    # n_r = 1 + (n - U) r^-s / sum r^-s, up to rounding (each off by less than one)
    ranks = np.arange(1, users + 1)
    share = (n - users) * ranks**-s / (ranks**-s).sum()
    assert np.all(np.abs(sizes - 1 - share) < 1)


def test_equal_sizes_differ_by_at_most_one_and_zipf_zero_is_equal():
    sizes = declared_sizes(1003, 10, "equal")
    assert sizes.sum() == 1003 and sizes.max() - sizes.min() <= 1
    assert np.array_equal(declared_sizes(1003, 10, "zipf", 0.0), sizes)


def test_default_number_of_users_is_n_over_records_per_user():
    ids = user_ids(_data(1234), {"users": "synthetic"}, seed=0)
    assert ids.max() + 1 == 1234 // RECORDS_PER_USER


def test_more_users_than_records_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"^dataset\.num_users must be in \[1, N = 20\]"):
        user_ids(_data(20), {"users": "synthetic", "num_users": 21}, seed=0)


def test_the_partition_depends_on_n_keys_and_seed_only():
    """Two training sets of the same size, different content (here: none readable), one
    partition: no data-dependent preprocessing."""
    labels = {USER_FIELDS: {"writer": np.arange(500) % 7}}
    assert np.array_equal(user_ids(_data(500), SYNTH, 9), user_ids(_data(500, labels), SYNTH, 9))


def test_from_data_reads_the_loaders_field_and_relabels_it():
    writers = np.array(["b", "a", "c", "a", "b", "b"])
    data = _data(6, {USER_FIELDS: {"writer": writers}})
    ids = user_ids(data, {"users": "from_data", "user_key": "writer"}, seed=0)
    assert ids.tolist() == [1, 0, 2, 0, 1, 1]
    assert user_sizes(ids).tolist() == [2, 3, 1]
    with pytest.raises(ConfigError, match=r"^dataset\.user_key='author' is not a user field of "
                                          r"this data set \(its fields: writer\)"):
        user_ids(data, {"users": "from_data", "user_key": "author"}, seed=0)
    with pytest.raises(ConfigError, match=r"its fields: none"):
        user_ids(_data(6), {"users": "from_data", "user_key": "writer"}, seed=0)
    with pytest.raises(DataError, match="one value per training record"):
        user_ids(_data(5, {USER_FIELDS: {"writer": writers}}),
                 {"users": "from_data", "user_key": "writer"}, seed=0)


def test_capping_keeps_at_most_k_a_user_all_of_the_small_ones_and_is_seeded():
    ids = synthetic_user_ids(2000, UsersConfig(num_users=100, zipf_exponent=1.5), seed=1)
    sizes = user_sizes(ids)
    for k in (1, 3, 8):
        kept = capped_indices(ids, k, seed=1)
        assert np.all(np.diff(kept) > 0)
        assert np.array_equal(user_sizes(ids[kept]), np.minimum(sizes, k))
        assert np.array_equal(kept, capped_indices(ids, k, seed=1))
    assert not np.array_equal(capped_indices(ids, 3, seed=1), capped_indices(ids, 3, seed=2))
    with pytest.raises(ConfigError, match=r"^privacy\.max_examples_per_user must be >= 1"):
        capped_indices(ids, 0, seed=1)


@pytest.mark.parametrize("settings,key", [
    ({"users": "households"}, "dataset.users"),
    ({"users": "from_data"}, "dataset.user_key"),
    ({"users": "from_data", "user_key": ""}, "dataset.user_key"),
    ({"num_users": 0}, "dataset.num_users"),
    ({"num_users": 2.5}, "dataset.num_users"),
    ({"num_users": MAX_USERS + 1}, "dataset.num_users"),
    ({"user_sizes": "pareto"}, "dataset.user_sizes"),
    ({"zipf_exponent": -1.0}, "dataset.zipf_exponent"),
    ({"zipf_exponent": float("nan")}, "dataset.zipf_exponent"),
    ({"zipf_exponent": 11.0}, "dataset.zipf_exponent"),
])
def test_bad_user_keys_are_refused_in_one_line_naming_the_key(settings, key):
    with pytest.raises(ConfigError) as err:
        users_config(settings)
    assert str(err.value).startswith(key) and "\n" not in str(err.value)
