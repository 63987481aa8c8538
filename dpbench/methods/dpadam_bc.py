"""DP-AdamBC (Tang, Shpilevskiy, Lecuyer, AAAI 2024, arXiv 2312.14334).

Adam's second moment of a DP gradient estimates E[g^2] = g_clean^2 + sigma_w^2, so the
preconditioner is inflated by the noise variance. DP-AdamBC subtracts it (their Alg. 1):
``theta -= lr * m_hat / sqrt(max(v_hat - sigma_w^2, gamma'))``. ``AdamBC`` below is that
update with AdamW's decoupled weight decay and Adam's eps; FIBER reuses it with the
attenuated variance A(omega) sigma_w^2 (``dpbench.methods.fiber``).
sigma_w = sigma C / B (expected B) is read from ``ctx.noise_std``: post-processing only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from dpbench.errors import ConfigError
from dpbench.methods import register_method
from dpbench.methods.base import DPMethod, RunInfo, StepContext, Update


class AdamBC(torch.optim.Optimizer):
    """AdamW whose bias-corrected second moment has a noise variance removed.

    Per coordinate at step t (Tang et al. 2024, Alg. 1; FIBER's AdamW, docs/fiber-disk-adambc.md):

    * ``m_t = beta1 m_{t-1} + (1 - beta1) g_t``, ``v_t = beta2 v_{t-1} + (1 - beta2) g_t^2``
    * ``m_hat = m_t / (1 - beta1^t)``, ``v_hat = v_t / (1 - beta2^t)``
    * ``v_bar = max(v_hat - noise_variance, eps_v)``  (eps_v is DP-AdamBC's gamma')
    * ``theta = (1 - lr wd) theta - lr m_hat / (sqrt(v_bar) + eps)``

    ``noise_variance`` is a param-group entry the owning method sets before every step
    (sigma_w^2 for DP-AdamBC, A(omega) sigma_w^2 for FIBER). With ``noise_variance = 0`` and
    ``eps_v = 0`` this is exactly ``torch.optim.AdamW``.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, eps_v: float = 1e-8,
                 noise_variance: float = 0.0) -> None:
        if lr < 0 or eps < 0 or eps_v < 0 or weight_decay < 0 or noise_variance < 0:
            raise ConfigError("AdamBC: lr, eps, eps_v, weight_decay and noise_variance "
                              "must be >= 0")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ConfigError(f"AdamBC: betas must lie in [0, 1) (got {betas})")
        if eps == 0 and eps_v == 0:
            raise ConfigError("AdamBC: eps and eps_v cannot both be 0 (division by zero)")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, eps_v=eps_v,
                                      noise_variance=noise_variance))
        self.floored_fraction = 0.0  # diagnostic: share of coordinates with v_bar = eps_v

    def set_noise_variance(self, value: float) -> None:
        """Set the variance subtracted from v_hat at the next step(s)."""
        for group in self.param_groups:
            group["noise_variance"] = float(value)

    def corrected_second_moment(self, p: torch.Tensor) -> torch.Tensor:
        """Return v_bar = max(v_hat - noise_variance, eps_v) for parameter ``p``."""
        group = next(g for g in self.param_groups if any(q is p for q in g["params"]))
        state = self.state[p]
        beta2 = group["betas"][1]
        v_hat = state["exp_avg_sq"] / (1 - beta2 ** state["step"])
        return (v_hat - group["noise_variance"]).clamp(min=group["eps_v"])

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 - torch's signature
        loss = closure() if closure is not None else None
        floored, total = 0, 0
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                g, m, v = p.grad, state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                m_hat = m / (1 - beta1 ** t)
                v_bar = (v / (1 - beta2 ** t)).sub_(group["noise_variance"])
                floored += int((v_bar <= group["eps_v"]).sum())
                total += v_bar.numel()
                v_bar.clamp_(min=group["eps_v"])
                if wd:
                    p.mul_(1 - lr * wd)
                p.addcdiv_(m_hat, v_bar.sqrt_().add_(group["eps"]), value=-lr)
        self.floored_fraction = floored / max(total, 1)
        return loss


class NoiseCorrectedAdam(Update):
    """An update whose optimiser is ``AdamBC``; subclasses say which variance it removes."""

    def setup(self, params: list[torch.nn.Parameter], info: RunInfo) -> None:
        super().setup(params, info)
        if self.needs_adam_bc() and not isinstance(self.optimizer, AdamBC):
            raise ConfigError(
                f"method {self.name!r} corrects Adam's second moment and needs "
                f"method.optimizer._target_=dpbench.methods.dpadam_bc.AdamBC (got "
                f"{type(self.optimizer).__name__})")

    def needs_adam_bc(self) -> bool:
        return True

    def removed_variance(self, ctx: StepContext) -> float:
        """Return the noise variance subtracted from v_hat (sigma_w^2 for DP-AdamBC)."""
        return ctx.noise_std ** 2 if ctx.private else 0.0

    def update(self, grads: list[torch.Tensor], ctx: StepContext) -> None:
        if isinstance(self.optimizer, AdamBC):
            self.optimizer.set_noise_variance(self.removed_variance(ctx))
        super().update(grads, ctx)

    def step_metrics(self) -> dict[str, float]:
        if isinstance(self.optimizer, AdamBC):
            return {"v_floored_fraction": self.optimizer.floored_fraction}
        return {}

    def summary(self) -> dict[str, Any]:
        return {"optimizer": type(self.optimizer).__name__}


#: DP-AdamBC: stage 8 is ``AdamBC`` with ``noise_variance = sigma_w^2 = (sigma C / B)^2``
DPADAM_BC = register_method(DPMethod("dpadam_bc", update_cls=NoiseCorrectedAdam))
