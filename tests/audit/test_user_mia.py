"""User-level membership inference (``dpbench-mia ... privacy.unit=user``): whole users in or
out, users scored from their records, metrics over users (dpbench/audit/mia/users.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpbench.audit.mia.split import memberships
from dpbench.audit.mia.users import (
    AGGREGATES,
    drawn_users,
    pool_users,
    user_labels,
    user_memberships,
    user_scores,
)
from dpbench.data.users import user_ids
from dpbench.utils.seeding import stream_seed

USERS = np.array([3, 0, 0, 1, 2, 2, 2, 4, 1, 3, 5, 5, 6, 7, 7, 0])


def test_the_split_draws_whole_users_and_no_user_is_on_both_sides():
    masks = user_memberships(11, 6, USERS)
    assert masks.shape == (6, len(USERS))
    for k, mask in enumerate(masks):
        drawn = drawn_users(11, k, int(USERS.max()) + 1)
        assert (mask == drawn[USERS]).all()  # a record is in iff its user is
        for user in np.unique(USERS):
            assert len(set(mask[USERS == user])) == 1  # never split
        assert user_labels(mask, USERS).tolist() == drawn.tolist()
    assert len({m.tobytes() for m in masks}) == 6  # every model its own draw


def test_the_user_split_has_its_own_stream():
    assert stream_seed(11, "mia_user_split", 0) != stream_seed(11, "mia_split", 0)
    assert stream_seed(11, "mia_user_split", 0) != stream_seed(11, "mia_user_split", 1)
    assert stream_seed(11, "mia_user_split", 0) != stream_seed(12, "mia_user_split", 0)
    # the same uniform draws through the example-level stream give another split
    users = np.arange(400)
    assert (user_memberships(11, 1, users) != memberships(11, 1, 400)).any()


def test_a_split_that_cuts_a_user_is_refused():
    mask = user_memberships(1, 1, USERS)[0].copy()
    mask[1] = not mask[1]  # user 0's first record alone
    with pytest.raises(ValueError, match="split between in and out"):
        user_labels(mask, USERS)


def test_each_attack_combines_a_users_records_as_documented():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=len(USERS))
    for user in np.unique(USERS):
        own = scores[USERS == user]
        assert math.isclose(user_scores("lira_online", scores, USERS)[user], own.sum(),
                            rel_tol=1e-12, abs_tol=1e-12)
        for attack in ("loss", "rmia"):
            assert math.isclose(user_scores(attack, scores, USERS)[user], own.mean(),
                                rel_tol=1e-12, abs_tol=1e-12)
    # lira_offline's per-record score is -log p (a one-sided p-value): Fisher's combination
    p = rng.uniform(1e-6, 1, size=len(USERS))
    combined = user_scores("lira_offline", -np.log(p), USERS)
    for user in np.unique(USERS):
        fisher = stats.combine_pvalues(p[USERS == user], method="fisher").pvalue
        assert math.isclose(combined[user], -math.log(fisher), rel_tol=1e-9)
    assert set(AGGREGATES) == {"loss", "lira_offline", "lira_online", "rmia"}


def test_the_pool_users_are_the_partition_read_at_the_pool_rows():
    class Data:
        train = range(300)
        extras: dict = {}

    settings = {"num_users": 30, "user_sizes": "zipf"}
    rows = np.arange(0, 300, 3)
    users = pool_users(Data(), settings, 5, rows)
    full = user_ids(Data(), settings, 5)[rows]
    assert sorted(set(users.tolist())) == list(range(len(set(full.tolist()))))
    for a in range(len(rows)):  # a bijection of the labels: same user <=> same label
        assert ((users == users[a]) == (full == full[a])).all()


def auc_ceiling(epsilon: float, delta: float) -> float:
    """The largest AUC any membership test can have against an (epsilon, delta)-DP mechanism:
    the area under TPR(f) = min(1, e^eps f + delta, 1 - e^-eps (1 - delta - f)) (Kairouz et
    al. 2015, Thm 2.1's region), by the trapezoid rule on a fine grid."""
    f = np.linspace(0.0, 1.0, 200_001)
    tpr = np.minimum.reduce([np.ones_like(f), math.exp(epsilon) * f + delta,
                             1 - math.exp(-epsilon) * (1 - delta - f)])
    return float(np.trapezoid(np.clip(tpr, 0, 1), f))


#: a pool of 400 digits records, about 135 users of 1 to 7 records, two targets (270 users
#: scored), four references
SETTING = ("mia.pool_size=400", "dataset.user_sizes=equal", "mia.targets=2",
           "mia.references=4", "privacy.unit=user")


def run_user_mia(*overrides: str):
    from dpbench.audit.mia.cli import run_mia
    from tests.audit.test_mia import mia_config

    return run_mia(mia_config(*SETTING, *overrides))


@pytest.mark.integration
def test_a_nonprivate_model_leaks_its_users():
    record = run_user_mia("method=nonprivate", "trainer.epochs=30", "trainer.batch_size=8")
    mia = record["mia"]
    assert mia["unit"] == "user" and mia["pool_users"]["users"] > 100
    assert mia["aggregate"]["lira_online"] == "sum"
    online = mia["attacks"]["lira_online"]
    # two targets' users pooled, half of them evaluate the threshold
    assert online["epsilon"]["evaluated"] == mia["pool_users"]["users"]
    assert online["auc_low"] > 0.65, online["auc"]  # measured 0.79 [0.74, 0.84]
    assert mia["attacks"]["rmia"]["auc_low"] > 0.6


@pytest.mark.integration
@pytest.mark.parametrize("strategy", ["uls", pytest.param("els", marks=pytest.mark.slow)])
def test_a_strongly_private_model_keeps_users_hidden(strategy):
    """At user-level epsilon 0.25 no attack may beat the DP ceiling on its AUC (0.562 at
    delta 1e-5): each attack's bootstrap lower bound lies below it, its point estimate within
    0.1 of chance (about two standard errors over 270 users), and every empirical epsilon
    stays below the accounted one."""
    batch = "trainer.batch_size=32" if strategy == "uls" else "trainer.batch_size=64"
    record = run_user_mia("method=dpsgd", "privacy=eps1", "privacy.target_epsilon=0.25",
                          f"privacy.user_strategy={strategy}", "trainer.epochs=10", batch)
    assert record["privacy_unit"] == "user"
    assert record["user_level"]["strategy"] == strategy
    epsilon = record["epsilon"]
    assert epsilon <= 0.25 * 1.001
    ceiling = auc_ceiling(epsilon, record["delta"])
    assert 0.55 < ceiling < 0.57
    for name, attack in record["mia"]["attacks"].items():
        assert attack["auc_low"] < ceiling, (name, attack["auc"])
        assert abs(attack["auc"] - 0.5) < 0.1, (name, attack["auc"])
        assert attack["epsilon"]["epsilon_lower"] <= epsilon, name
