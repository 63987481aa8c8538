"""The mechanism of a user-level run fixed before training: rate, steps, delta, sigma.

``plan_user_privacy`` is ``plan.plan_privacy`` for ``privacy.unit=user``
(``user_level.py``, docs/privacy-unit-and-streams.md). What one Poisson draw is over, and
what ``trainer.batch_size`` counts, depends on the strategy:

- ULS: Poisson over the U users; ``trainer.batch_size`` is B_u, the expected users per
  batch, so q_u = B_u / U and an epoch is int(U / B_u) steps (``samplers.steps_per_epoch``
  over users);
- ELS: Poisson over the N_kept examples left once each user keeps at most k
  (``data/users.capped_indices``); ``trainer.batch_size`` is B examples, q = B / N_kept.

Delta protects a user: its default is ``accountant.default_delta(U)`` (below 1/U), and an
explicit ``privacy.delta`` must be below 1/U. Sigma is calibrated for the strategy's own
accountant (``calibrate_user_noise_multiplier``), or a fixed one is range-checked. Cyclic
Poisson batches over bands (BandMF) have no user-level accounting and are refused.
"""

from __future__ import annotations

from typing import Any

from dpbench.errors import ConfigError
from dpbench.privacy.accountant import check_accountable, default_delta
from dpbench.privacy.plan import PrivacyPlan
from dpbench.privacy.samplers import DEFAULT_SAMPLER, RELATION_LABEL, Sampling, steps_per_epoch
from dpbench.privacy.user_level import (
    ULS,
    UserLevel,
    calibrate_user_noise_multiplier,
    check_user_level,
)
from dpbench.utils.ranges import require


def plan_user_privacy(privacy: Any, trainer: Any, num_users: int, num_examples: int,
                      private: bool = True, bands: int | None = None
                      ) -> tuple[PrivacyPlan, UserLevel]:
    """Return (plan, user) of a user-level run; ConfigError naming the key if impossible.

    ``privacy`` and ``trainer`` are the run's ``PrivacyConfig`` and ``TrainerConfig`` (read
    by attribute); ``num_users`` = U; ``num_examples`` the training examples the run samples
    from (ELS: N_kept, after the cap; ULS: unused but for the message). The plan's
    ``sample_rate`` is q_u (ULS) or q (ELS), its ``sampling.dataset_size`` U or N_kept.
    """
    user = UserLevel(privacy.user_strategy, privacy.max_examples_per_user)
    sampler = getattr(trainer, "sampler", DEFAULT_SAMPLER)
    relation, chosen = check_user_level(user.strategy, sampler, privacy.accountant,
                                        getattr(privacy, "neighbouring", None))
    if bands is not None:
        raise ConfigError(f"privacy.unit=user: this method samples cyclic Poisson batches over "
                          f"{bands} bands, which have no user-level accountant; use "
                          f"privacy.unit=example")
    require(num_users >= 1, "dataset.num_users", ">= 1", num_users)
    uls = user.strategy == ULS
    n = num_users if uls else num_examples
    what = "users" if uls else f"examples kept (at most {user.max_examples_per_user} a user)"
    require(trainer.batch_size <= n, "trainer.batch_size", f"<= {n} {what}",
            trainer.batch_size, why=" (under privacy.user_strategy="
            f"{user.strategy} it counts {'users' if uls else 'examples'} per batch)")
    q = trainer.batch_size / n
    per_epoch = steps_per_epoch(n, trainer.batch_size)
    sampling = Sampling(sampler, relation, n, int(trainer.batch_size), per_epoch)
    total = trainer.epochs * per_epoch
    private = private and privacy.enabled
    if not private:
        return PrivacyPlan(False, q, q * n, per_epoch, total, None, 0.0, None,
                           privacy.target_epsilon, 1, sampling), user
    delta = privacy.delta if privacy.delta is not None else default_delta(num_users)
    require(delta < 1.0 / num_users, "privacy.delta", f"< 1/U = {1.0 / num_users:.3g}",
            shown=f"{delta:.3g}", why=f" under privacy.unit=user ({num_users} users)")
    if privacy.noise_multiplier is not None:
        sigma, accountant, target = float(privacy.noise_multiplier), chosen, None
        check_accountable(sigma, q, total, delta, accountant)
    else:
        sigma, accountant = calibrate_user_noise_multiplier(
            user.strategy, privacy.target_epsilon, delta, q, total,
            user.max_examples_per_user, chosen, relation)
        target = privacy.target_epsilon
    note = None if privacy.accountant else (
        f"privacy.accountant=null: chose {chosen}, the accountant for privacy.user_strategy="
        f"{user.strategy} under {RELATION_LABEL[relation]} (docs/privacy-unit-and-streams.md)")
    return PrivacyPlan(True, q, q * n, per_epoch, total, delta, sigma, accountant, target, 1,
                       sampling, note), user
