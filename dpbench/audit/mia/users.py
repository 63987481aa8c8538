"""User-level membership inference (``privacy.unit=user``): users in or out, scored per user.

The unit of membership is the unit of privacy. Under ``privacy.unit=user`` a user is in or out
of a model's training set with all of its pool records (Kandpal et al. 2023, "User Inference
Attacks on Large Language Models", Sec. 3: the attacker asks whether *any* of a user's data
trained the model):

- **The users of the pool** (``pool_users``): the run's user partition of the whole training
  split (``dataset.users``: a loader's field or the declared synthetic partition, drawn from
  stream ``user_partition`` of ``mia.seed``), read at the pool's rows and relabelled
  0..U-1. The pool is the example-level run's own pool, so the two units are attacked on the
  same records; a user's records outside the pool train no model.
- **The split** (``user_memberships``): model k takes each of the U users independently with
  probability 1/2 from stream ``mia_user_split`` k of ``mia.seed`` (its own stream, not the
  example-level ``mia_split``); a drawn user's records all train it, the others none.
  Independent inclusion of users is what lets each user count as one trial of the user-level
  empirical epsilon (Steinke et al. 2023, with the user as the unit).
- **Scores** (``user_scores``): every attack scores each record as at the example level
  (its reference models' IN/OUT are the users' draws), then a user's records are combined:

  ========================  ===========================================================
  attack                    a user's score
  ========================  ===========================================================
  ``lira_online``           the SUM of its records' log-likelihood ratios: the user's
                            log-likelihood ratio when its records' confidences are
                            independent given membership, so the Neyman-Pearson test of
                            the user (Kandpal et al. 2023, Sec. 3.1, derive the same
                            statistic; they normalise by m for users of one size, which
                            would mis-rank users of different sizes here)
  ``lira_offline``          Fisher's combination of its records' one-sided p-values
                            under OUT: ``-log chi2.sf(2 sum_i -log p_i, 2 m)``, the
                            user's combined p-value (each record's score is ``-log
                            p_i``), comparable across sizes m
  ``loss``, ``rmia``        the MEAN of its records' scores: neither is a likelihood
                            ratio, and the mean is Kandpal et al.'s normalised
                            statistic (for ``loss`` their reference-free one, the mean
                            log-likelihood)
  ========================  ===========================================================

- **Metrics** (``metrics.attack_metrics`` unchanged) are over users: AUC, TPR at low FPR,
  the bootstrap (users resampled) and the empirical epsilon with one trial a user, compared
  with the target's accounted user-level epsilon.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy import stats

from dpbench.data.users import user_ids
from dpbench.utils.seeding import stream_seed

#: how each attack's per-record scores become a user's score (module docstring)
AGGREGATES = {"lira_online": "sum", "lira_offline": "fisher", "loss": "mean", "rmia": "mean"}


def pool_users(data: Any, dataset_settings: Mapping[str, Any], seed: int,
               pool_rows: np.ndarray) -> np.ndarray:
    """Return the user (0..U-1) of each pool record: the partition of ``data``'s whole
    training split under the data set's user keys and ``seed``, read at ``pool_rows``."""
    ids = user_ids(data, dataset_settings, seed)[np.asarray(pool_rows, dtype=np.int64)]
    _, relabelled = np.unique(ids, return_inverse=True)
    return relabelled.astype(np.int64).reshape(-1)


def drawn_users(seed: int, model: int, num_users: int) -> np.ndarray:
    """Return the bool mask of the users that train model ``model`` (each with
    probability 1/2, stream ``mia_user_split`` ``model`` of ``seed``)."""
    rng = np.random.default_rng(stream_seed(seed, "mia_user_split", model))
    return rng.random(num_users) < 0.5


def user_memberships(seed: int, models: int, users: np.ndarray) -> np.ndarray:
    """Return the ``(models, n)`` record masks: record i trains model k iff its user
    ``users[i]`` was drawn for model k (whole users only)."""
    users = np.asarray(users, dtype=np.int64)
    count = int(users.max()) + 1
    return np.stack([drawn_users(seed, k, count)[users] for k in range(models)])


def user_labels(record_members: np.ndarray, users: np.ndarray) -> np.ndarray:
    """Return each user's membership from a model's record mask; raise ValueError unless
    every user's records agree (a split that cut a user would make the metrics wrong)."""
    record_members, users = np.asarray(record_members, bool), np.asarray(users, np.int64)
    count = int(users.max()) + 1
    inside = np.bincount(users, weights=record_members, minlength=count)
    sizes = np.bincount(users, minlength=count)
    if ((inside != 0) & (inside != sizes)).any():
        raise ValueError("a user's records are split between in and out")
    return inside == sizes


def user_scores(attack: str, record_scores: np.ndarray, users: np.ndarray) -> np.ndarray:
    """Return each user's score from its records' scores under ``attack`` (``AGGREGATES``)."""
    record_scores, users = np.asarray(record_scores, np.float64), np.asarray(users, np.int64)
    count = int(users.max()) + 1
    total = np.bincount(users, weights=record_scores, minlength=count)
    sizes = np.bincount(users, minlength=count)
    rule = AGGREGATES[attack]
    if rule == "sum":
        return total
    if rule == "mean":
        return total / sizes
    # fisher: each record's score is -log p_i >= 0; the combined p-value's -log
    return -stats.chi2.logsf(2.0 * total, 2 * sizes)


def pool_facts(users: np.ndarray) -> dict[str, Any]:
    """Return what the record states of the pool's users (sizes only)."""
    sizes = np.bincount(np.asarray(users, np.int64))
    return {"users": int(len(sizes)), "records": int(sizes.sum()),
            "records_per_user": {"min": int(sizes.min()), "median": float(np.median(sizes)),
                                 "max": int(sizes.max())}}
