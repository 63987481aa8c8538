"""The privacy unit of a run in the loop: ``privacy.unit=example`` (the default) or ``user``.

Under ``privacy.unit=user`` (docs/privacy-unit-and-streams.md) each training row carries its
user's id (``data.extras[USERS_KEY]``, an int64 tensor: ``dpbench/data/users.py``), at most
k = ``privacy.max_examples_per_user`` rows of each user are kept (``data.users.capped_indices``),
and ``privacy.user_strategy`` picks how a step samples:

- ``uls``: Poisson over the U users at q = B / U (``trainer.batch_size`` B is the expected
  number of USERS a step), each user's gradient sum clipped to C by the engine
  (``engine/per_user.py``); the plan, the ledger and the accountant see DP-SGD over U units;
- ``els``: Poisson over the N_k capped rows at q = B / N_k (B expected EXAMPLES), each example
  clipped to C; accounted with the mixture-of-Gaussians event of a user at the cap k
  (``privacy/samplers.py``, sampler ``els``).

What is refused, in one line naming the key, before any model is built: a method not verified
under the user unit, a sampler other than Poisson, a K-process run under ULS, a data set
without user ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dpbench.data.users import capped_indices
from dpbench.errors import ConfigError
from dpbench.privacy.user_level import (
    DEFAULT_MAX_EXAMPLES_PER_USER,
    DEFAULT_STRATEGY,
    DEFAULT_UNIT,
    ULS,
    check_max_examples_per_user,
    check_strategy,
    check_unit,
)
from dpbench.training.user_sampling import UserFacts, user_facts

#: where a data set's loader (or the synthetic partition) puts each training row's user id
USERS_KEY = "train_users"
#: methods verified under privacy.unit=user: their only query is the clipped gradient sum,
#: whose sensitivity is C per user under ULS and the MoG bound under ELS
USER_LEVEL_METHODS = ("dpsgd",)


@dataclass(frozen=True)
class UserSetup:
    """A run's user-level set-up: the strategy, each row's user, the rows kept under the cap."""

    strategy: str
    k: int
    users: torch.Tensor  # [N] int64, one per training row
    kept: np.ndarray  # the rows kept under the cap (sorted)
    facts: UserFacts

    @property
    def per_user_clipping(self) -> bool:
        return self.strategy == ULS

    @property
    def accounted_size(self) -> int:
        """The population the sampler draws from: U users (ULS) or N_k rows (ELS)."""
        return self.facts.users if self.strategy == ULS else self.facts.kept_examples


def check_user_method(name: str) -> None:
    """Refuse, in one line naming the reason, a method not verified under privacy.unit=user."""
    if name not in USER_LEVEL_METHODS:
        raise ConfigError(
            f"method={name} is not verified under privacy.unit=user (its extra queries, "
            "clipping or noise shaping are accounted and checked per example, not per user); "
            f"run it with privacy.unit=example, or use method={' or '.join(USER_LEVEL_METHODS)}")


def unit_of(privacy: Any) -> str:
    """Return ``privacy.unit`` (the default for settings without the key)."""
    return check_unit(getattr(privacy, "unit", DEFAULT_UNIT) or DEFAULT_UNIT)


def user_setup(privacy: Any, trainer: Any, method: Any, data: Any, seed: int,
               distributed: bool = False) -> UserSetup | None:
    """Return the run's ``UserSetup`` (None under ``privacy.unit=example``), or raise a
    one-line ``ConfigError``."""
    if unit_of(privacy) == "example":
        return None
    strategy = check_strategy(getattr(privacy, "user_strategy", DEFAULT_STRATEGY)
                              or DEFAULT_STRATEGY)
    if getattr(method, "private", True):
        check_user_method(getattr(method, "name", "?"))
    sampler = getattr(trainer, "sampler", "poisson")
    if sampler != "poisson":
        raise ConfigError(f"trainer.sampler={sampler}: privacy.unit=user samples Poisson "
                          f"(over users: uls; over capped examples: els); use "
                          "trainer.sampler=poisson")
    if strategy == ULS and distributed:
        raise ConfigError("privacy.unit=user with privacy.user_strategy=uls runs in one process "
                          "(a rank's slice could split a user's rows); drop torchrun or use "
                          "privacy.user_strategy=els")
    k = check_max_examples_per_user(getattr(privacy, "max_examples_per_user",
                                            DEFAULT_MAX_EXAMPLES_PER_USER))
    users = data.extras.get(USERS_KEY)
    if users is None:
        raise ConfigError(f"privacy.unit=user: dataset {data.name!r} gives no user ids; set "
                          "dataset.users=synthetic (a declared, seeded partition) or "
                          "dataset.user_key to the field naming each record's user")
    users = torch.as_tensor(users, dtype=torch.int64).cpu()
    if users.shape != (len(data.train),):
        raise ConfigError(f"privacy.unit=user: {len(users)} user ids for "
                          f"{len(data.train)} training rows")
    kept = capped_indices(users.numpy(), k, seed)
    return UserSetup(strategy, k, users, kept, user_facts(strategy, users.numpy(), k, kept))
