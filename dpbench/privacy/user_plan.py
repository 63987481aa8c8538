"""The privacy plan of a user-level run (``privacy.unit=user``): rate, steps, delta, sigma.

The user-level counterpart of ``plan.plan_privacy``, fixed before training from the number of
units the sampler draws from (``units``): U users under ULS (q = B / U, B the expected users
a step), the N_k examples kept under the per-user cap under ELS (q = B / N_k). Sigma is
calibrated to the target on the strategy's own accountant
(``user_level.calibrate_user_noise_multiplier``: DP-SGD over users for ULS, the
mixture-of-Gaussians event for ELS), and delta defaults to one below 1/U, U the number of
USERS (the unit the guarantee protects), under either strategy.
"""

from __future__ import annotations

from typing import Any

from dpbench.errors import ConfigError
from dpbench.privacy.accountant import NOISE_MULTIPLIER_MAX, NOISE_MULTIPLIER_MIN
from dpbench.privacy.accountant import default_delta as compute_default_delta
from dpbench.privacy.plan import PrivacyPlan
from dpbench.privacy.samplers import DEFAULT_SAMPLER, Sampling, steps_per_epoch
from dpbench.privacy.user_level import (
    ULS,
    UserLevel,
    calibrate_user_noise_multiplier,
    check_user_level,
    user_epsilon,
)
from dpbench.utils.ranges import require


def plan_user_privacy(privacy: Any, trainer: Any, units: int, users: int, strategy: str,
                      max_examples_per_user: int, private: bool) -> PrivacyPlan:
    """Return the plan of a user-level run drawing from ``units`` (U or N_k) with ``users``
    users; raise a one-line ``ConfigError`` naming the key where it cannot be run."""
    sampler = getattr(trainer, "sampler", DEFAULT_SAMPLER)
    user = UserLevel(strategy, int(max_examples_per_user))
    relation, chosen = check_user_level(strategy, sampler, privacy.accountant,
                                        getattr(privacy, "neighbouring", None))
    what = "users" if strategy == ULS else "examples kept under the per-user cap"
    require(trainer.batch_size <= units, "trainer.batch_size", f"<= {units} {what}",
            trainer.batch_size,
            why=" (privacy.user_strategy=uls: B is the expected number of users a step)"
            if strategy == ULS else "")
    q = trainer.batch_size / units
    per_epoch = steps_per_epoch(units, trainer.batch_size)
    sampling = Sampling(DEFAULT_SAMPLER, relation, units, int(trainer.batch_size), per_epoch)
    total = trainer.epochs * per_epoch
    if not (private and privacy.enabled):
        return PrivacyPlan(False, q, q * units, per_epoch, total, None, 0.0, None,
                           privacy.target_epsilon, 1, sampling, user=user)
    delta = privacy.delta if privacy.delta is not None else compute_default_delta(users)
    require(delta < 1.0 / users, "privacy.delta", f"< 1/U = {1.0 / users:.3g} (U users)",
            shown=f"{delta:.3g}")
    if privacy.noise_multiplier is not None:
        sigma, accountant, target = float(privacy.noise_multiplier), chosen, None
        require(NOISE_MULTIPLIER_MIN <= sigma <= NOISE_MULTIPLIER_MAX,
                "privacy.noise_multiplier",
                f"in [{NOISE_MULTIPLIER_MIN:g}, {NOISE_MULTIPLIER_MAX:g}]", sigma)
        if not user_epsilon(user, [(sigma, q, total)], delta, accountant, relation) < float(
                "inf"):
            raise ConfigError(f"privacy.noise_multiplier={sigma:g} cannot be accounted at "
                              f"privacy.unit=user (epsilon infinite)")
    else:
        sigma, accountant = calibrate_user_noise_multiplier(
            strategy, privacy.target_epsilon, delta, q, total, user.max_examples_per_user,
            chosen, relation)
        target = privacy.target_epsilon
    note = None if privacy.accountant else (
        f"privacy.accountant=null: chose {chosen}, the accountant of "
        f"privacy.user_strategy={strategy} under {relation}")
    return PrivacyPlan(True, q, q * units, per_epoch, total, delta, sigma, accountant, target,
                       1, sampling, note, user=user)
