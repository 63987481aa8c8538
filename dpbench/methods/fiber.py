"""FIBER ("A Differentially Private Optimizer with Filter-Aware Innovation Bias Correction",
arXiv 2605.03425): DiSK's two-point observation, an innovation-space filter with its own gain
omega, and AdamW whose second moment removes the *filtered* noise variance.

Per step (docs/fiber-disk-adambc.md; all after the release is post-processing, so epsilon is
DP-AdamW's):

* observation (kappa, gamma) as DiSK, combined per example before clipping (``disk.py``);
* innovation filter: ``nu_t = g_t - g~_{t-1}``, ``r_t = (1 - omega) r_{t-1} + omega nu_t``,
  ``g~_t = g~_{t-1} + r_t``; start ``g~_0 = g_0``, ``r_0 = 0``;
* AdamW on g~ with ``v_bar = max(v_hat - A(omega) sigma_w^2, eps_v)``, where
  ``A(omega) = (2 - omega) / (4 - 3 omega)`` is the filter's stationary white-noise power gain.

Ablations (settings): ``filter=ema`` replaces the filter by ``g~_t = (1 - omega) g~_{t-1} +
omega g_t`` (gain ``omega / (2 - omega)``); ``correction=standard`` subtracts the unfiltered
sigma_w^2 (DP-AdamBC's), ``correction=none`` subtracts nothing (plain AdamW on g~).

The method is a pair of reused halves: DiSK's mechanism (``TwoPointObservation``) and
``FilterAwareAdam``, DP-AdamBC's update (``NoiseCorrectedAdam``) with the filter in front.
"""

from __future__ import annotations

from typing import Any

import torch

from dpbench.method_settings.fiber import FiberSettings
from dpbench.methods import register_method
from dpbench.methods.base import DPMethod, OptimizerFactory, StepContext
from dpbench.methods.disk import TwoPointObservation
from dpbench.methods.dpadam_bc import NoiseCorrectedAdam


def innovation_noise_gain(omega: float) -> float:
    """Return A(omega) = (2 - omega) / (4 - 3 omega): Var(g~) / Var(g) on white noise.

    The filter is the AR(2) recursion g~_t = 2(1-omega) g~_{t-1} - (1-omega) g~_{t-2} +
    omega g_t, whose stationary variance for unit white input is (2-omega)/(4-3omega)
    (FIBER's closed form; A(1) = 1, A -> 1/2 as omega -> 0).
    """
    return (2.0 - omega) / (4.0 - 3.0 * omega)


def ema_noise_gain(omega: float) -> float:
    """Return omega / (2 - omega): the white-noise power gain of g~ = (1-omega) g~ + omega g."""
    return omega / (2.0 - omega)


class FilterAwareAdam(NoiseCorrectedAdam):
    """FIBER's stages 7 and 8: the innovation filter (or the EMA ablation), then AdamBC with
    the filtered noise variance removed (the two-point mechanism remembers the weights itself,
    in its ``advance``)."""

    def __init__(self, name: str, settings: FiberSettings,
                 optimizer: OptimizerFactory | None = None) -> None:
        super().__init__(name, settings, optimizer)
        self.filtered: list[torch.Tensor] | None = None  # g~_{t-1}
        self.residual: list[torch.Tensor] | None = None  # r_{t-1}

    def needs_adam_bc(self) -> bool:
        return self.settings.correction != "none"

    def noise_gain(self) -> float:
        """Return A: the power gain of the configured filter on the white DP noise."""
        omega = self.settings.omega
        if self.settings.filter == "innovation":
            return innovation_noise_gain(omega)
        return ema_noise_gain(omega)

    def removed_variance(self, ctx: StepContext) -> float:
        """Return A sigma_w^2 (filter_aware), sigma_w^2 (standard) or 0 (none)."""
        if not ctx.private:
            return 0.0
        correction = self.settings.correction
        if correction == "filter_aware":
            return self.noise_gain() * ctx.noise_std ** 2
        return ctx.noise_std ** 2 if correction == "standard" else 0.0

    def postprocess(self, grads: list[torch.Tensor], ctx: StepContext) -> list[torch.Tensor]:
        """Return g~_t from the innovation filter (or the EMA ablation); see the module doc."""
        omega = self.settings.omega
        if self.filtered is None:  # g~_0 = g_0, r_0 = 0
            self.filtered = [g.detach().clone() for g in grads]
            self.residual = [torch.zeros_like(g) for g in grads]
        elif self.settings.filter == "innovation":
            for f, r, g in zip(self.filtered, self.residual, grads):
                r.mul_(1.0 - omega).add_(g - f, alpha=omega)  # r_t = (1-w) r + w (g_t - g~)
                f.add_(r)  # g~_t = g~_{t-1} + r_t
        else:
            for f, g in zip(self.filtered, grads):
                f.mul_(1.0 - omega).add_(g, alpha=omega)
        return [f.clone() for f in self.filtered]

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "noise_gain_A": self.noise_gain()}

    def state_dict(self) -> dict[str, Any]:
        return {"filtered": self.filtered, "residual": self.residual}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("filtered", "residual"):
            value = state.get(key)
            setattr(self, key, [t.to(p.device) for t, p in zip(value, self.params)]
                    if value else None)


#: FIBER: DiSK's two-point mechanism (stages 2/4) and the filter-aware AdamBC update
FIBER = register_method(DPMethod("fiber", FiberSettings(), TwoPointObservation, FilterAwareAdam))
