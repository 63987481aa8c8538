"""The mechanism fixed before training: sampling rate, steps, delta and the calibrated sigma.

``plan_privacy`` checks the settings that depend on the data set's size and calibrates the
noise multiplier for the target epsilon (or checks a given one is accountable), before any
model is built or any example is read. The loop releases under this plan; the audit sizes its
canaries from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpbench.errors import ConfigError, PrivacyError
from dpbench.privacy.accountant import check_accountable
from dpbench.privacy.accountant import default_delta as compute_default_delta
from dpbench.privacy.banded_mf import amplified_equivalent
from dpbench.privacy.calibration import calibrate_noise_multiplier
from dpbench.privacy.ledger import combined_noise_multiplier
from dpbench.privacy.samplers import (
    ADD_REMOVE,
    DEFAULT_SAMPLER,
    RELATION_LABEL,
    Sampling,
    default_accountant,
    resolve_sampling,
    steps_per_epoch,
)
from dpbench.utils.ranges import require


@dataclass(frozen=True)
class PrivacyPlan:
    """The mechanism fixed before training: rate, steps, delta and calibrated sigma."""

    private: bool
    sample_rate: float
    expected_batch_size: float
    steps_per_epoch: int
    total_steps: int
    delta: float | None
    noise_multiplier: float
    accountant: str | None
    target_epsilon: float | None
    bands: int = 1  # cyclic Poisson over b partitions: accounted as DP-SGD at b q, T / b steps
    #: the batch sampler and its neighbouring relation (``samplers.py``)
    sampling: Sampling = Sampling()
    #: set when ``privacy.accountant`` was null: which accountant was chosen, and why
    accountant_note: str | None = None
    #: privacy.unit=user: the strategy and k (``user_level.UserLevel``; ``user_plan.py``);
    #: None: the unit is one example
    user: Any = None


@dataclass(frozen=True)
class StepPlan:
    """The mechanism of every step, fixed once from the validated settings before training.

    ``sampling``: ``trainer.sampler`` (``poisson``, ``fixed_size``, ``shuffle``), or
    ``cyclic_poisson`` over ``bands`` partitions (BandMF; ``privacy/ledger.py``);
    ``noise_multiplier``: the sigma calibrated for the run (the
    combined multiplier of a step's queries may not go below it); ``gradient_noise_multiplier``:
    sigma_g of the gradient query (sigma unless the mechanism splits it with extra queries).
    ``gradient_noise_std`` is the one place the noise's std is computed.
    """

    private: bool
    sampling: str
    sample_rate: float
    expected_batch_size: float
    noise_multiplier: float
    gradient_noise_multiplier: float
    bands: int = 1

    def gradient_noise_std(self, sensitivity: float) -> float:
        """Return sigma_g S: the std of the Gaussian noise added to the gradient's clipped sum."""
        return self.gradient_noise_multiplier * sensitivity

    def released_noise_std(self, sensitivity: float) -> float:
        """Return sigma_g S / B: the per-coordinate std of the released mean gradient (B the
        *expected* batch size), what post-processing reads as ``StepContext.noise_std``."""
        return self.gradient_noise_std(sensitivity) / self.expected_batch_size


def step_plan(plan: PrivacyPlan, gradient_noise_multiplier: float,
              cyclic: bool = False) -> StepPlan:
    """Return the step plan of ``plan`` with the mechanism's gradient multiplier (stage 6)."""
    return StepPlan(plan.private, "cyclic_poisson" if cyclic else plan.sampling.sampler,
                    plan.sample_rate,
                    plan.expected_batch_size, plan.noise_multiplier,
                    gradient_noise_multiplier if plan.private else 0.0, plan.bands)


def plan_privacy(privacy: Any, trainer: Any, dataset_size: int, private: bool,
                 bands: int | None = None) -> PrivacyPlan:
    """Check the data-dependent settings and calibrate sigma; raise ConfigError if impossible.

    ``privacy`` and ``trainer`` are the run's ``PrivacyConfig`` and ``TrainerConfig``
    (``dpbench.config.schema``, a layer above: read by attribute).

    ``bands`` = b (cyclic Poisson sampling): sigma is calibrated for the equivalent DP-SGD,
    rate b q and ceil(T / b) steps (``amplified_equivalent``).

    ``trainer.sampler`` (default poisson) and ``privacy.neighbouring`` (default: the
    sampler's own) are checked against the accountant before anything else
    (``samplers.resolve_sampling``); every sampler has the same steps per epoch.
    """
    n = dataset_size
    sampler = getattr(trainer, "sampler", DEFAULT_SAMPLER)
    relation = resolve_sampling(sampler, getattr(privacy, "neighbouring", None),
                                privacy.accountant, private and privacy.enabled)
    chosen = privacy.accountant or default_accountant(sampler, relation)
    if sampler != DEFAULT_SAMPLER and bands is not None:
        raise ConfigError(f"trainer.sampler={sampler}: this method samples cyclic Poisson "
                          f"batches over {bands} bands itself; use trainer.sampler=poisson")
    if bands is not None and relation != ADD_REMOVE:
        raise ConfigError(f"privacy.neighbouring={relation}: this method's cyclic Poisson "
                          "batches are accounted as DP-SGD under add/remove only; use "
                          "privacy.neighbouring=null")
    require(trainer.batch_size <= n, "trainer.batch_size", f"<= N = {n} training examples",
            trainer.batch_size)
    q = trainer.batch_size / n
    per_epoch = steps_per_epoch(n, trainer.batch_size)  # as Opacus's DPDataLoader: int(1 / q)
    sampling = Sampling(sampler, relation, n, int(trainer.batch_size), per_epoch)
    total = trainer.epochs * per_epoch
    b = bands or 1
    require(b * q <= 1, "method.settings.bands * trainer.batch_size", f"<= N = {n}",
            why=" (cyclic Poisson samples each of the b partitions at rate b B / N; "
                f"got bands={b}, batch_size={trainer.batch_size})")
    require(b <= total, "method.settings.bands", f"<= the run's {total} steps", b,
            why="; lower it or train longer")
    rate, steps = amplified_equivalent(q, total, b)
    private = private and privacy.enabled
    if not private:
        return PrivacyPlan(False, q, q * n, per_epoch, total, None, 0.0, None,
                           privacy.target_epsilon, b, sampling)
    delta = privacy.delta if privacy.delta is not None else compute_default_delta(n)
    require(delta < 1.0 / n, "privacy.delta", f"< 1/N = {1.0 / n:.3g}", shown=f"{delta:.3g}")
    if privacy.noise_multiplier is not None:
        sigma, accountant, target = float(privacy.noise_multiplier), chosen, None
        check_accountable(sigma, q, total, delta, accountant)
    else:
        sigma, accountant = calibrate_noise_multiplier(
            privacy.target_epsilon, delta, rate, steps, chosen, sampling)
        target = privacy.target_epsilon
    note = None if privacy.accountant else (
        f"privacy.accountant=null: chose {chosen}, the accountant for trainer.sampler={sampler} "
        f"under {RELATION_LABEL[relation]} (docs/sampling.md)")
    return PrivacyPlan(True, q, q * n, per_epoch, total, delta, sigma, accountant, target,
                       b, sampling, note)


def account_release(plan: PrivacyPlan, ledger: Any, accountant: Any, step: int,
                    queries: list[Any]) -> None:
    """Record step ``step``'s released queries in the ledger and the accountant.

    Refuses a release noised below the calibrated multiplier. Cyclic Poisson sampling: b
    steps are one DP-SGD step at rate b q (BandMF, Thm 4), accounted at the first of them,
    before it can fail.
    """
    sigma = combined_noise_multiplier(queries)
    if sigma < plan.noise_multiplier * (1 - 1e-9):
        raise PrivacyError(f"step {step} released noise multiplier {sigma:.6g}, below the "
                           f"calibrated {plan.noise_multiplier:.6g}")
    if step % plan.bands:
        return
    rate = plan.bands * plan.sample_rate
    sampling = plan.sampling.ledger_spec()
    accountant.step(noise_multiplier=ledger.record(rate, queries, sampling), sample_rate=rate)
