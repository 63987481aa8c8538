"""The plan of a user-level run (``dpbench/privacy/user_plan.py``): what q counts, delta
below 1/U, sigma calibrated on the strategy's own accountant, refusals naming the key."""

from __future__ import annotations

import pytest

from dpbench.config.schema import PrivacyConfig, TrainerConfig
from dpbench.errors import ConfigError
from dpbench.privacy import user_level as ul
from dpbench.privacy.accountant import default_delta
from dpbench.privacy.calibration import RELATIVE_TOLERANCE
from dpbench.privacy.user_plan import plan_user_privacy


def _privacy(**kw):
    return PrivacyConfig(**{"unit": "user", **kw})


def test_uls_samples_users_and_calibrates_on_the_user_level_accountant():
    trainer = TrainerConfig(epochs=2, batch_size=20)
    plan, user = plan_user_privacy(_privacy(target_epsilon=4.0), trainer, num_users=400,
                                   num_examples=3000)
    assert user == ul.UserLevel("uls", 8)
    assert plan.sample_rate == 20 / 400 and plan.steps_per_epoch == 20 and plan.total_steps == 40
    assert plan.sampling.dataset_size == 400 and plan.expected_batch_size == 20
    assert plan.delta == default_delta(400) < 1 / 400
    spent = user.epsilon([(plan.noise_multiplier, plan.sample_rate, plan.total_steps)],
                         plan.delta)
    assert (1 - RELATIVE_TOLERANCE) * 4.0 <= spent <= 4.0
    assert plan.accountant == "pld" and "privacy.user_strategy=uls" in plan.accountant_note


def test_els_samples_the_kept_examples_with_a_fixed_sigma():
    trainer = TrainerConfig(epochs=1, batch_size=50)
    privacy = _privacy(user_strategy="els", max_examples_per_user=2, target_epsilon=None,
                       noise_multiplier=3.0)
    plan, user = plan_user_privacy(privacy, trainer, num_users=300, num_examples=500)
    assert user == ul.UserLevel("els", 2)
    assert plan.sample_rate == 0.1 and plan.total_steps == 10 and plan.noise_multiplier == 3.0
    assert plan.sampling.dataset_size == 500 and plan.target_epsilon is None


@pytest.mark.parametrize("privacy,trainer,users,examples,key", [
    ({}, {"batch_size": 500}, 400, 3000, "trainer.batch_size must be <= 400 users"),
    ({"user_strategy": "els"}, {"batch_size": 600}, 400, 500,
     "trainer.batch_size must be <= 500 examples kept"),
    ({"delta": 0.01}, {}, 400, 3000, "privacy.delta must be < 1/U = 0.0025"),
    ({"user_strategy": "els", "accountant": "rdp"}, {}, 400, 3000, "privacy.accountant=rdp"),
    ({"user_strategy": "els", "neighbouring": "replace_one"}, {}, 400, 3000,
     "privacy.neighbouring=replace_one"),
])
def test_refusals_name_the_key(privacy, trainer, users, examples, key):
    with pytest.raises(ConfigError) as err:
        plan_user_privacy(_privacy(**privacy), TrainerConfig(**trainer), users, examples)
    assert str(err.value).startswith(key) and "\n" not in str(err.value)


def test_bands_and_a_non_private_run():
    with pytest.raises(ConfigError, match=r"^privacy\.unit=user: this method samples cyclic"):
        plan_user_privacy(_privacy(), TrainerConfig(), 400, 3000, bands=4)
    plan, _ = plan_user_privacy(_privacy(), TrainerConfig(batch_size=40), 400, 3000,
                                private=False)
    assert not plan.private and plan.noise_multiplier == 0.0 and plan.sample_rate == 0.1
