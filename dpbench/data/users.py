"""Each training record's user: read from the data, or a declared, seeded synthetic partition.

``privacy.unit=user`` protects all of one user's records (``privacy/user_level.py``), so the
run needs ``user_ids``: an int64 array aligned with the training set, entry i the user of
training record i, users numbered 0..U-1. Two sources (``dataset.users``):

- ``from_data``: a loader with a natural user field hands it over as
  ``TaskData.extras["user_fields"][name]`` (a sequence aligned with its training set, any
  hashable labels), and ``dataset.user_key`` names the field. None of the built-in data sets
  has one: digits, MNIST, Fashion-MNIST, CIFAR-10/100 and CelebA attributes (the identity
  file is not among the copies read) are images or rows without an owner; Adult and Dutch
  census rows are one person each (user = example); GLUE and the generation sets are
  sentences without authors; ETT is two transformers' readings. A plug-in loader (or a
  future one, e.g. a federated set with writers or clients) provides the field.
- ``synthetic`` (default): a declared partition, so every method can run under both units on
  every data set offline. Its sizes are fixed by (N, ``dataset.num_users`` = U,
  ``dataset.user_sizes``, ``dataset.zipf_exponent`` = s) alone: ``zipf`` gives user r
  (r = 1..U) a share proportional to r^-s of the N records (s = 0 is equal sizes), every
  user at least one, rounded by largest remainder so that the sizes sum to N; ``equal``
  gives N // U or N // U + 1. Which records a user holds is a uniformly random assignment
  drawn from the run's stream ``user_partition`` (spawned from the run's seed,
  ``utils/seeding.py``): a permutation of the N indices cut into the sizes.

Nothing here reads a record's content: a synthetic partition depends on N, the declared keys
and the seed only; ``from_data`` relabels the given field's values 0..U-1 (a bijection). So
the partition is no data-dependent preprocessing of the private data.

``capped_indices`` keeps at most k records a user (ELS: ``privacy.max_examples_per_user``),
chosen uniformly at random from sub-stream 1 of ``user_partition``, again without reading a
record. The config keys are ``UsersConfig`` (mirrored by every ``conf/dataset/*.yaml``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpbench.errors import ConfigError, DataError
from dpbench.utils.ranges import in_range
from dpbench.utils.seeding import stream_seed

#: ``dataset.users`` values: where each training record's user comes from (first: default)
USER_SOURCES = ("synthetic", "from_data")
#: ``dataset.user_sizes`` values: the synthetic partition's size distribution (first: default)
USER_SIZES = ("zipf", "equal")
#: a synthetic partition's mean records a user when ``dataset.num_users`` is null
RECORDS_PER_USER = 10
#: the most users a synthetic partition may declare (its arrays are O(users))
MAX_USERS = 10**7
#: the Zipf exponents accepted (0: equal shares)
MAX_ZIPF_EXPONENT = 10.0
#: where a loader hands its natural user fields over (``TaskData.extras``)
USER_FIELDS = "user_fields"
#: the dataset keys of ``UsersConfig``: the framework reads them, loaders never see them
USER_KEYS = ("users", "user_key", "num_users", "user_sizes", "zipf_exponent")
#: sub-streams of ``user_partition``
_PARTITION, _CAP = 0, 1


@dataclass(frozen=True)
class UsersConfig:
    """The ``dataset`` keys of the user partition, read under ``privacy.unit=user``."""

    #: synthetic (a declared, seeded partition) | from_data (the loader's ``user_key`` field)
    users: str = USER_SOURCES[0]
    #: from_data: the field giving each training record's user
    user_key: str | None = None
    #: synthetic: the number of users U (null: N // RECORDS_PER_USER, at least 1)
    num_users: int | None = None
    #: synthetic: zipf (user r holds a share proportional to r^-s) | equal
    user_sizes: str = USER_SIZES[0]
    #: synthetic, zipf: the exponent s
    zipf_exponent: float = 1.0

    def __post_init__(self) -> None:
        if self.users not in USER_SOURCES:
            raise ConfigError(f"dataset.users must be one of {', '.join(USER_SOURCES)} "
                              f"(got {self.users!r})")
        if self.users == "from_data" and not (isinstance(self.user_key, str) and self.user_key):
            raise ConfigError(f"dataset.user_key must name the field giving each record's user "
                              f"under dataset.users=from_data (got {self.user_key!r}); or use "
                              f"dataset.users=synthetic")
        in_range("dataset.num_users", self.num_users, 1, MAX_USERS, closed="[]", integer=True,
                 expected=f"an integer in [1, {MAX_USERS:.0e}] or null (N // "
                          f"{RECORDS_PER_USER})", allow_none=True)
        if self.user_sizes not in USER_SIZES:
            raise ConfigError(f"dataset.user_sizes must be one of {', '.join(USER_SIZES)} "
                              f"(got {self.user_sizes!r})")
        in_range("dataset.zipf_exponent", self.zipf_exponent, 0, MAX_ZIPF_EXPONENT,
                 closed="[]", expected=f"a number in [0, {MAX_ZIPF_EXPONENT:g}]")


def users_config(settings: Mapping[str, Any]) -> UsersConfig:
    """Return the validated user partition of a data set's settings (defaults where unset);
    a ConfigError naming the ``dataset.<key>`` otherwise."""
    return UsersConfig(**{k: settings[k] for k in USER_KEYS if k in settings})


def declared_sizes(n: int, num_users: int, sizes: str = "zipf",
                   exponent: float = 1.0) -> np.ndarray:
    """Return the U user sizes of a synthetic partition of n records, largest first: at least
    one each, the rest shared by weight (r^-s for zipf, 1 for equal) with the largest
    remainders rounded up, so that they sum to n exactly."""
    if not 1 <= num_users <= n:
        raise ConfigError(f"dataset.num_users must be in [1, N = {n}] training records, so "
                          f"that every user holds one (got {num_users})")
    ranks = np.arange(1, num_users + 1, dtype=np.float64)
    weights = ranks ** -float(exponent) if sizes == "zipf" else np.ones(num_users)
    spare = n - num_users
    share = spare * weights / weights.sum()
    out = np.floor(share).astype(np.int64)
    short = spare - int(out.sum())
    if short:  # largest remainders first; ties to the lower rank (stable sort)
        order = np.argsort(-(share - out), kind="stable")
        out[order[:short]] += 1
    return out + 1


def synthetic_user_ids(n: int, config: UsersConfig, seed: int) -> np.ndarray:
    """Return the int64 user of each of n training records under the synthetic partition:
    user u (0-based, u = r - 1) holds ``declared_sizes(...)[u]`` records, which ones drawn by
    a permutation from stream ``user_partition`` of run ``seed``."""
    num_users = config.num_users or max(1, n // RECORDS_PER_USER)
    sizes = declared_sizes(n, num_users, config.user_sizes, config.zipf_exponent)
    rng = np.random.default_rng(stream_seed(seed, "user_partition", _PARTITION))
    order = rng.permutation(n)
    ids = np.empty(n, dtype=np.int64)
    ids[order] = np.repeat(np.arange(num_users, dtype=np.int64), sizes)
    return ids


def field_user_ids(extras: Mapping[str, Any], n: int, user_key: str) -> np.ndarray:
    """Return the int64 user of each of n training records from the loader's field
    ``user_key`` (``extras["user_fields"]``), its values relabelled 0..U-1 in sorted order."""
    fields = extras.get(USER_FIELDS) or {}
    if user_key not in fields:
        have = ", ".join(sorted(fields)) or "none (this data set has no user field)"
        raise ConfigError(f"dataset.user_key={user_key!r} is not a user field of this data "
                          f"set (its fields: {have}); use dataset.users=synthetic")
    values = np.asarray(fields[user_key])
    if values.ndim != 1 or len(values) != n:
        raise DataError(f"the loader's user field {user_key!r} has shape {values.shape}, not "
                        f"one value per training record ({n})")
    _, ids = np.unique(values, return_inverse=True)
    return ids.astype(np.int64).reshape(-1)


def user_ids(data: Any, settings: Mapping[str, Any], seed: int) -> np.ndarray:
    """Return the int64 user of each training record of ``data`` (a ``TaskData``) under the
    data set's settings (``UsersConfig`` keys) and the run's seed."""
    config = users_config(settings)
    n = len(data.train)
    if config.users == "from_data":
        return field_user_ids(data.extras, n, config.user_key)
    return synthetic_user_ids(n, config, seed)


def user_sizes(ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Return the number of records of each user 0..U-1."""
    return np.bincount(np.asarray(ids, dtype=np.int64))


def capped_indices(ids: Sequence[int] | np.ndarray, max_examples_per_user: int,
                   seed: int) -> np.ndarray:
    """Return the sorted indices of the records kept when each user keeps at most k (ELS):
    a user's records in a random order from sub-stream 1 of ``user_partition``, the first
    k kept. Depends on the ids and the seed only, never on a record's content."""
    ids = np.asarray(ids, dtype=np.int64)
    k = int(max_examples_per_user)
    if k < 1:
        raise ConfigError(f"privacy.max_examples_per_user must be >= 1 (got {k})")
    rng = np.random.default_rng(stream_seed(seed, "user_partition", _CAP))
    shuffled = rng.permutation(len(ids))
    # within each user, the records in shuffled order; keep the first k of each
    by_user = shuffled[np.argsort(ids[shuffled], kind="stable")]
    sorted_ids = ids[by_user]
    starts = np.searchsorted(sorted_ids, sorted_ids, side="left")
    rank = np.arange(len(ids)) - starts
    return np.sort(by_user[rank < k])
