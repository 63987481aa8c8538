"""Adaptive clipping by noisy quantile tracking (Andrew et al. 2021, "Differentially Private
Learning with Adaptive Clipping", Alg. 1), optionally normalised.

Per step t with threshold C_t (docs/adaptive-clipping.md):

* clip: u_i -> clip_{C_t}(u_i) (sensitivity C_t) or clip_{C_t}(u_i) / C_t (``normalize``,
  sensitivity 1; Zhao et al. 2025);
* count: release the *centred* indicator sum s = sum_i (1[||u_i|| <= theta C_t] - 1/2)
  + N(0, sigma_b^2): each term lies in [-1/2, 1/2], so its sensitivity is 1/2 and its noise
  multiplier 2 sigma_b (as TF-Privacy's quantile estimator); b_t = s / B + 1/2 (B expected);
* gradient noise multiplier sigma_delta = (sigma^-2 - (2 sigma_b)^-2)^(-1/2) (Andrew et al.
  Thm. 1), so the pair composes to exactly one Gaussian release with multiplier sigma: the
  loop's ledger combines the two queries and the accountant is told sigma;
* update (geometric, post-processing of b_t, in the mechanism's ``advance``: the one place
  C_t changes, handed the released values only):
  C_{t+1} = max(C_LB, C_t exp(-eta_C (b_t - gamma))), with C_LB = 0 here (unbounded).

Opacus's ``AdaClipDPOptimizer`` accounts with sigma_delta and under-reports epsilon; dpbench
accounts with the combined multiplier the ledger computes.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dpbench.errors import ConfigError
from dpbench.method_settings.adaclip import AdaClipSettings
from dpbench.methods import register_method
from dpbench.methods.base import DPMethod, ExtraQuery, Released, RunInfo, StepContext
from dpbench.methods.dpsgd import FlatClipping

COUNT_QUERY = "unclipped_count"


def gradient_sigma(sigma: float, sigma_b: float) -> float:
    """Return sigma_delta = (sigma^-2 - (2 sigma_b)^-2)^(-1/2) (Andrew et al. 2021, Thm. 1)."""
    if sigma >= 2 * sigma_b:
        raise ConfigError(f"adaptive clipping needs sigma < 2 sigma_b (got sigma={sigma:.4g}, "
                          f"sigma_b={sigma_b:.4g}); raise method.settings.sigma_b")
    return (sigma**-2 - (2 * sigma_b) ** -2) ** -0.5


def geometric_update(threshold: float, unclipped_fraction: float, target_quantile: float,
                     clip_lr: float, floor: float) -> float:
    """Return C_{t+1} = max(C_LB, C_t exp(-eta_C (b_t - gamma))) (Zhao et al. 2025, Eq. 3)."""
    return max(floor, threshold * math.exp(-clip_lr * (unclipped_fraction - target_quantile)))


class AdaptiveClipping(FlatClipping):
    """Clipping at the current threshold C_t, the centred count query and the split sigma.

    ``threshold`` (C_t) is the mechanism's moving parameter: max(C_0, C_LB) at set-up, then,
    in ``advance``, the geometric update from the step's *noisy* count only; every C_t > 0
    gives the declared sensitivity. C_LB = ``clip_floor()`` (0: unbounded).
    """

    def _sigma_b(self, expected_batch_size: float) -> float:
        value = self.settings.sigma_b
        return float(value) if value is not None else expected_batch_size / 10.0

    def clip_floor(self) -> float:
        """Return C_LB (0: unbounded)."""
        return 0.0

    def validate(self, info: RunInfo) -> None:
        if info.private:
            gradient_sigma(info.noise_multiplier, self._sigma_b(info.expected_batch_size))

    def setup(self, params, info: RunInfo) -> None:
        super().setup(params, info)
        initial = self.settings.initial_clip
        self.threshold = max(float(initial if initial is not None else info.clip_norm),
                             self.clip_floor())
        self.sigma_b = self._sigma_b(info.expected_batch_size)
        self.unclipped_fraction = math.nan
        self.trajectory: list[float] = []  # C_t of every step
        self.fractions: list[float] = []  # noisy b_t of every step

    def clip_threshold(self, ctx: StepContext) -> float:
        """Return C_t (clipping at min(1, C_t/||u_i||), divided by C_t when normalised)."""
        return self.threshold

    def gradient_noise_multiplier(self, sigma: float) -> float:
        """Return sigma_delta = (sigma^-2 - (2 sigma_b)^-2)^(-1/2)."""
        return gradient_sigma(sigma, self.sigma_b)

    def extra_queries(self, norms: torch.Tensor, ctx: StepContext) -> list[ExtraQuery]:
        """Return the centred count query 1[||u_i|| <= theta C_t] - 1/2 (sensitivity 1/2)."""
        bound = self.settings.count_threshold * self.threshold
        centred = (norms <= bound).to(torch.float32) - 0.5
        return [ExtraQuery(COUNT_QUERY, centred, sensitivity=0.5, noise_std=self.sigma_b)]

    # ---- the moving threshold: post-processing of the noisy count ------------------------
    def advance(self, released: Released) -> None:
        """Set b_t = s / B + 1/2 from the noisy count s and C_{t+1} = max(C_LB,
        C_t exp(-eta_C (b_t - gamma))) (Andrew et al. 2021, Alg. 1; Zhao et al. 2025, Eq. 3).

        B is the expected batch size; nothing without a released count (set-up, a restore,
        a non-private run).
        """
        if COUNT_QUERY not in released.extras:
            return
        assert self.info is not None
        threshold = self.threshold
        self.unclipped_fraction = (float(released.extras[COUNT_QUERY])
                                   / self.info.expected_batch_size + 0.5)
        self.trajectory.append(threshold)
        self.fractions.append(self.unclipped_fraction)
        self.threshold = geometric_update(
            threshold, self.unclipped_fraction, self.settings.target_quantile,
            self.settings.clip_lr, self.clip_floor())

    # ---- diagnostics: the released threshold's trajectory (post-processing) ---------------
    def step_metrics(self) -> dict[str, float]:
        """Return C_t (the threshold the step used) and the noisy unclipped fraction b_t."""
        used = self.trajectory[-1] if self.trajectory else self.threshold
        return {"clip_threshold": used, "unclipped_fraction": self.unclipped_fraction}

    def floor_binding_share(self) -> float:
        """Return the share of steps whose threshold C_t sat at the floor C_LB (0 unbounded)."""
        floor, trajectory = self.clip_floor(), self.trajectory
        if floor <= 0 or not trajectory:
            return 0.0
        return sum(c <= floor * (1 + 1e-9) for c in trajectory) / len(trajectory)

    def summary(self) -> dict[str, Any]:
        return {"sigma_b": self.sigma_b, "clip_floor": self.clip_floor(),
                "final_clip_threshold": self.threshold,
                "floor_binding_share": self.floor_binding_share(),
                "clip_threshold_trajectory": list(self.trajectory),
                "unclipped_fraction_trajectory": list(self.fractions)}

    def state_dict(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "unclipped_fraction": self.unclipped_fraction,
                "trajectory": list(self.trajectory), "fractions": list(self.fractions)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.threshold = float(state.get("threshold", self.threshold))
        self.unclipped_fraction = float(state.get("unclipped_fraction", math.nan))
        self.trajectory = list(state.get("trajectory", []))
        self.fractions = list(state.get("fractions", []))


#: unbounded adaptive clipping: C_LB = 0, so C_t may shrink towards 0; the update is the
#: YAML's optimiser (the threshold's diagnostics are the mechanism's, released values)
ADACLIP = register_method(DPMethod("adaclip", AdaClipSettings(), AdaptiveClipping))
