"""The mechanism: the half of a method that decides what is released, so the half that sets epsilon.

A method is a mechanism and an update (``dpbench.methods.base``). The mechanism's hooks are
the only code of a method that can change the privacy cost, and the only code of a method a
privacy review must read; everything in the update is post-processing of released values.
The defaults are DP-SGD with flat clipping (Abadi et al. 2016):

==============================  ===============================================================
``participation_bands()``        None: Poisson sampling; b: cyclic Poisson over b partitions
``evaluation_points(ctx)``       where per-example gradients are taken: [theta]
``clip_factors(norms, ctx)``     per-example factors min(1, C / ||u_i||)
``sensitivity(ctx)``             the bound on ||factor_i u_i||: C (the loop checks it)
``gradient_noise_multiplier``    sigma of the gradient query: sigma (adaptive clipping splits it)
``extra_queries(norms, ctx)``    privatised queries besides the gradient: none
``noise_shaper(info)``           the map from the i.i.d. noise to the released noise: None
``advance(released)``            the moving parameters, from released values: none move
==============================  ===============================================================

Some mechanisms have parameters that move during a run (the adaptive threshold C_t, DiSK's
theta_{t-1}, IVON's posterior scale). They change in ``advance`` alone, which the loop calls
once per step after the update with the step's released values (``Released``: the noisy
extra queries, the released gradient, the update's ``public_state()``), and the method calls
at set-up and after a restore with no release (``step`` None); the update holds no reference
to the mechanism, so nothing else can assign them. The mechanism's guarantee must still hold
for every value they can take, and the sensitivity it declares is the one of its current
parameters (checked by the loop at every step).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from dpbench.methods.context import EvalPoint, Released, RunInfo, StepContext
from dpbench.methods.hooks import PRIVACY_HOOKS, UPDATE_HOOKS, refuse_hooks
from dpbench.privacy.ledger import Query
from dpbench.privacy.plan import StepPlan

__all__ = ["PRIVACY_HOOKS", "EvalPoint", "ExtraQuery", "Mechanism", "NoiseShaper",
           "flat_clip_factors", "gradient_queries"]

#: guards 0/0 for an all-zero per-example gradient
NORM_EPS = 1e-6


def flat_clip_factors(norms: torch.Tensor, threshold: float, normalize: bool) -> torch.Tensor:
    """Return min(1, C / ||g_i||), divided by C when ``normalize`` (sensitivity 1).

    Flat clipping (Abadi et al. 2016): clip_C(g) = g min(1, C / ||g||), sensitivity C.
    Normalised clipping (Zhao et al. 2025, Sec. 3; Andrew et al. 2021): clip_C(g) / C, so
    every contribution has norm <= 1 and the learning rate is decoupled from C. The rule of
    every clipping method (stage 5, docs/adding-a-method.md).
    """
    factors = (threshold / (norms + NORM_EPS)).clamp(max=1.0)
    return factors / threshold if normalize else factors


class NoiseShaper(Protocol):
    """Turns a step's i.i.d. Gaussian noise (one tensor per parameter) into released noise."""

    def __call__(self, noise: list[torch.Tensor]) -> list[torch.Tensor]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any], device: torch.device | None = None
                        ) -> None: ...


@dataclass
class ExtraQuery:
    """A privatised per-example query besides the gradient (e.g. a clip indicator).

    ``values`` holds one number per example, each within [-sensitivity, sensitivity] (the loop
    checks it); the loop sums them, adds N(0, noise_std^2) and hands the noisy sum back to
    ``after_step`` under ``name``.
    """

    name: str
    values: torch.Tensor
    sensitivity: float
    noise_std: float


class Mechanism:
    """DP-SGD's release: Poisson sampling, the gradient at theta, flat clipping, i.i.d. noise.

    ``settings`` is the method's frozen settings dataclass (the update gets the same values);
    ``name`` the method's, for error messages.
    """

    def __init__(self, name: str, settings: Any) -> None:
        self.name = name
        self.settings = settings
        self.params: list[nn.Parameter] = []
        self.info: RunInfo | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        refuse_hooks(cls, UPDATE_HOOKS, "post-process the release; they belong to the "
                     "method's Update, not to its Mechanism")

    # ---- housekeeping --------------------------------------------------------------------
    def validate(self, info: RunInfo) -> None:
        """Raise ``ConfigError`` for settings whose release cannot run (before training)."""

    def setup(self, params: list[nn.Parameter], info: RunInfo) -> None:
        """Build the mechanism's state over the trainable parameters."""
        self.params = params
        self.info = info

    def gradient_evaluations_per_step(self) -> int:
        """Return how many gradient evaluations a step makes (compute, not privacy)."""
        return 1

    def summary(self) -> dict[str, Any]:
        """Return facts about the release for results.json."""
        return {}

    def step_metrics(self) -> dict[str, float]:
        """Return per-step diagnostics of the release to log (e.g. the clip threshold used)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Return the state a checkpoint keeps (the parameters the update has moved)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()``'s entries (``state`` may hold the update's too)."""

    # ---- sampling (stage 1) and evaluation points (stage 2) ------------------------------
    def participation_bands(self) -> int | None:
        """Return b for cyclic Poisson sampling over b fixed partitions (None: plain Poisson).

        With b, step t samples partition t mod b at rate b q and the loop accounts the run
        as DP-SGD at rate b q for ceil(T / b) steps (BandMF's amplification theorem).
        """
        return None

    def evaluation_points(self, ctx: StepContext) -> list[EvalPoint]:
        """Return the points whose per-example gradients are combined before clipping."""
        return [EvalPoint()]

    # ---- clipping (stage 5) --------------------------------------------------------------
    def clip_factors(self, norms: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Return per-example factors: flat clipping min(1, C / ||u_i||) (Abadi et al. 2016)."""
        return flat_clip_factors(norms, ctx.clip_norm, normalize=False)

    def sensitivity(self, ctx: StepContext) -> float:
        """Return the L2 bound on one example's clipped contribution (C for flat clipping)."""
        return ctx.clip_norm

    # ---- privatised queries and the noise (stage 6) --------------------------------------
    def gradient_noise_multiplier(self, sigma: float) -> float:
        """Return the multiplier of the gradient query's noise (sigma unless split)."""
        return sigma

    def extra_queries(self, norms: torch.Tensor, ctx: StepContext) -> list[ExtraQuery]:
        """Return the privatised per-example queries besides the gradient."""
        return []

    def noise_shaper(self, info: RunInfo) -> NoiseShaper | None:
        """Return the map from each step's i.i.d. gradient noise to the noise released.

        None: i.i.d. noise (DP-SGD). The loop owns the object (its state is checkpointed
        with the loop's); it must keep each step's per-participation sensitivity.
        """
        return None

    # ---- the moving parameters (after the update) ----------------------------------------
    def advance(self, released: Released) -> None:
        """Move the mechanism's parameters from ``released`` (the only place they change).

        ``released.step`` is the step just taken, or None at set-up and after a restore (then
        re-derive the state from the public weights and ``released.public``). DP-SGD has no
        moving parameters.
        """


def gradient_queries(mechanism: Mechanism, ctx: StepContext, plan: StepPlan,
                     extra: Sequence[ExtraQuery]) -> list[Query]:
    """Return the ledger entries of a step: the gradient query (its noise from ``plan``, at
    the mechanism's current sensitivity) and the mechanism's extra ones."""
    sens = mechanism.sensitivity(ctx)
    queries = [Query("gradient", sens, plan.gradient_noise_std(sens))]
    queries += [Query(q.name, q.sensitivity, q.noise_std) for q in extra]
    if not all(math.isfinite(q.noise_std) for q in queries):
        raise ValueError("non-finite noise std")
    return queries
