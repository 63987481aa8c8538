"""DiSK (Zhang, Bu, Balle, Hong, Razaviyayn, Mirrokni, arXiv 2410.03883): a simplified
Kalman filter on the privatised gradient, with a two-point observation.

Stages (docs/adding-a-method.md): 2 evaluation points, 4 their per-example combination
(done by the loop, *before* clipping, so one release and no extra privacy cost), 7 the
filter, 8 the base optimiser (any ``torch.optim`` factory from the YAML, AdamW by default).

* observation (DiSK eq. for u_t; docs/fiber-disk-adambc.md), with
  ``a = (1 - kappa) / (kappa gamma)`` and ``d_t = theta_t - theta_{t-1}``:
  ``u_i = a grad f_i(theta_t + gamma d_t) + (1 - a) grad f_i(theta_t)``;
* release (the loop): ``g_t = (sum_i clip_C(u_i) + N(0, sigma^2 C^2 I)) / B``;
* filter, the paper's convention: ``g~_t = (1 - kappa) g~_{t-1} + kappa g_t``, g~_0 = g_0.
  (Opacus's research port swaps kappa and 1 - kappa.)

kappa = 1 gives a = 0 and g~ = g: the base optimiser on the DP gradient.
"""

from __future__ import annotations

from typing import Any

import torch

from dpbench.method_settings.disk import DiSKSettings
from dpbench.methods import register_method
from dpbench.methods.base import (
    DPMethod,
    EvalPoint,
    Mechanism,
    OptimizerFactory,
    Released,
    StepContext,
    Update,
)


class TwoPointObservation(Mechanism):
    """Stage 2 of DiSK/FIBER: the points theta and theta + gamma d_t, d_t = theta_t - theta_{t-1}.

    ``previous_params`` (theta_{t-1}) is the mechanism's moving parameter, moved in
    ``advance`` after each step from the public weights (post-processing of releases): the
    weights seen at the previous ``advance`` become theta_{t-1}. The two points are combined
    per example before clipping (``u_i`` above), so any theta_{t-1} gives one release of
    sensitivity C; book-keeping forms ||u_i|| and sum_i f_i u_i from both points' activations
    and output gradients (cross terms included) and Opacus hooks from materialised gradients,
    so the method never reads per-example gradients itself.
    """

    def __init__(self, name: str, settings: DiSKSettings) -> None:
        super().__init__(name, settings)
        self.previous_params: list[torch.Tensor] | None = None  # theta_{t-1}
        self._latest: list[torch.Tensor] | None = None  # theta_t, seen at the last advance

    @property
    def lookahead_weight(self) -> float:
        """Return a = (1 - kappa) / (kappa gamma), the weight of grad f(theta + gamma d)."""
        kappa, gamma = self.settings.kappa, self.settings.gamma
        return (1.0 - kappa) / (kappa * gamma)

    def gradient_evaluations_per_step(self) -> int:
        """Return 2, or 1 when a = 0 or a = 1 (the first step always takes 1: d_0 = 0)."""
        return 1 if self.lookahead_weight in (0.0, 1.0) else 2

    def evaluation_points(self, ctx: StepContext) -> list[EvalPoint]:
        """Return [theta with weight 1 - a, theta + gamma d with weight a] (DiSK's u_t)."""
        a, gamma = self.lookahead_weight, self.settings.gamma
        if a == 0.0 or self.previous_params is None:  # u = grad f(theta) exactly (d_0 = 0)
            return [EvalPoint()]
        offsets = [gamma * (p.detach() - prev)
                   for p, prev in zip(self.params, self.previous_params)]
        if a == 1.0:
            return [EvalPoint(weight=1.0, offsets=offsets)]
        return [EvalPoint(weight=1.0 - a), EvalPoint(weight=a, offsets=offsets)]

    def advance(self, released: Released) -> None:
        """After step t: theta_{t-1} <- theta_t (the weights seen at the last advance) and
        remember theta_{t+1}; with no release (set-up, a restore) remember the weights only.

        The weights are post-processing of released gradients, so d_t is public.
        """
        if released.step is not None:
            self.previous_params = self._latest
        self._latest = [p.detach().clone() for p in self.params]

    def state_dict(self) -> dict[str, Any]:
        return {"previous_params": self.previous_params}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        prev = state.get("previous_params")
        self.previous_params = ([t.to(p.device) for t, p in zip(prev, self.params)]
                                if prev is not None else None)


class KalmanFilteredUpdate(Update):
    """DiSK's stages 7 and 8: ``g~_t = (1 - kappa) g~_{t-1} + kappa g_t``, then the optimiser."""

    def __init__(self, name: str, settings: DiSKSettings,
                 optimizer: OptimizerFactory | None = None) -> None:
        super().__init__(name, settings, optimizer)
        self.filtered: list[torch.Tensor] | None = None  # g~_{t-1}

    def postprocess(self, grads: list[torch.Tensor], ctx: StepContext) -> list[torch.Tensor]:
        """Return g~_t = (1 - kappa) g~_{t-1} + kappa g_t (DiSK, simplified Kalman update)."""
        kappa = self.settings.kappa
        if self.filtered is None:
            self.filtered = [g.detach().clone() for g in grads]
        else:
            for f, g in zip(self.filtered, grads):
                f.mul_(1.0 - kappa).add_(g, alpha=kappa)
        return [f.clone() for f in self.filtered]

    def state_dict(self) -> dict[str, Any]:
        return {"filtered": self.filtered}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        f = state.get("filtered")
        self.filtered = [t.to(p.device) for t, p in zip(f, self.params)] if f else None


#: DiSK: the two-point observation, then the filter and the YAML's optimiser
DISK = register_method(DPMethod("disk", DiSKSettings(), TwoPointObservation,
                                KalmanFilteredUpdate))
