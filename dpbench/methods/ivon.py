"""IVON: Improved Variational Online Newton (Shen et al., ICML 2024, arXiv 2402.17641).

Written for dpbench from the paper's Algorithm 1 (the GPL ``ivon-opt`` package is only a test
oracle). The posterior is q = N(m, diag(sigma_v^2)) with sigma_v^2 = 1 / (lambda (h + delta)),
lambda the effective sample size (``ess``, default N) and delta the weight decay. One step:

1. sample theta = m + e / sqrt(lambda (h + delta)), e ~ N(0, I)      (Alg. 1 line 3)
2. g = grad of the mean loss at theta                                 (line 4)
3. h_hat = g * (theta - m) / sigma_v^2   (reparameterised, ``hess=reparam``, line 5)
4. g_m <- beta1 g_m + (1 - beta1) g                                   (line 6)
5. h <- beta2 h + (1-beta2) h_hat + 0.5 (1-beta2)^2 (h - h_hat)^2 / (h + delta)   (line 7)
6. m <- m - alpha (g_m / (1 - beta1^t) + delta m) / (h + delta)       (lines 8-9)

with alpha = lr (h0 + delta) (the paper's learning-rate rescaling). ``hess=gradsq`` uses
h_hat = lambda g^2 instead (the squared-gradient estimate; ``dp_ivon`` adds the DP noise
correction). In dpbench, step 1 is the mechanism's ``evaluation_points`` (the loop adds the
offsets, takes the gradients and removes them), steps 3-6 are the update's ``update``.
Prediction is Bayesian model averaging over posterior samples (the update's ``evaluate``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from dpbench.errors import ConfigError
from dpbench.method_settings.ivon import IVONSettings
from dpbench.methods import register_method
from dpbench.methods.base import (
    DPMethod,
    EvalPoint,
    HeldOut,
    Mechanism,
    OptimizerFactory,
    Released,
    RunInfo,
    StepContext,
    Update,
)
from dpbench.utils.seeding import stream_generator


def noise_corrected_square(g: torch.Tensor, noise_var: float) -> torch.Tensor:
    """Return g^2 - sigma_w^2: unbiased for the clean g_0^2 when g = g_0 + N(0, sigma_w^2).

    E[(g_0 + w)^2] = g_0^2 + sigma_w^2 (docs/ivon.md); the projection max(., 0) that
    follows makes the estimate non-negative (and biased up where |g_0| << sigma_w).
    """
    return g.square() - noise_var


def sample_offsets(stds: Sequence[torch.Tensor],
                   generator: torch.Generator | None) -> list[torch.Tensor]:
    """Return e * sigma_v per parameter, e ~ N(0, I) (Alg. 1 line 3: theta - m).

    One flat draw over all parameters in order, so a seed fixes the whole sample.
    """
    total = sum(s.numel() for s in stds)
    device = stds[0].device if stds else None
    e = torch.randn(total, generator=generator, device=device,
                    dtype=stds[0].dtype if stds else None)
    out, start = [], 0
    for s in stds:
        out.append(e[start:start + s.numel()].view_as(s) * s)
        start += s.numel()
    return out


class IVONOptimizer(torch.optim.Optimizer):
    """IVON's state (momentum g_m, curvature h, step t) and its update (Alg. 1 lines 6-9).

    The mean m is the parameters themselves. ``ess=None`` is filled in with N by the method.
    ``step()`` is not used: the method calls ``ivon_step(grads, curvature)`` with the Hessian
    estimate it chose.
    """

    def __init__(self, params: Iterable[nn.Parameter], lr: float = 0.1,
                 ess: float | None = None, hess_init: float = 0.1, beta1: float = 0.9,
                 beta2: float = 0.99999, weight_decay: float = 1e-4) -> None:
        checks = {"lr": lr > 0, "hess_init": hess_init > 0, "beta1": 0 <= beta1 < 1,
                  "beta2": 0 <= beta2 < 1, "weight_decay": weight_decay > 0,
                  "ess": ess is None or ess > 0}
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ConfigError(f"IVON optimiser: invalid {', '.join(bad)} (need lr, hess_init, "
                              "weight_decay > 0, 0 <= beta1, beta2 < 1, ess > 0 or null)")
        super().__init__(params, dict(lr=lr, ess=ess, hess_init=hess_init, beta1=beta1,
                                      beta2=beta2, weight_decay=weight_decay))

    def _state(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, Any]:
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["momentum"] = torch.zeros_like(p)
            state["hess"] = torch.full_like(p, group["hess_init"])
        return state

    def _pairs(self):
        for group in self.param_groups:
            for p in group["params"]:
                yield p, group, self._state(p, group)

    def set_ess(self, ess: float) -> None:
        """Fill in lambda = ``ess`` wherever the config left it null."""
        for group in self.param_groups:
            if group["ess"] is None:
                group["ess"] = float(ess)

    def hessians(self) -> list[torch.Tensor]:
        """Return h per parameter."""
        return [state["hess"] for _, _, state in self._pairs()]

    def posterior_std(self) -> list[torch.Tensor]:
        """Return sigma_v = 1 / sqrt(lambda (h + delta)) per parameter."""
        return [torch.rsqrt(group["ess"] * (state["hess"] + group["weight_decay"]))
                for _, group, state in self._pairs()]

    def precision_scale(self) -> list[torch.Tensor]:
        """Return 1 / sigma_v^2 = lambda (h + delta) per parameter."""
        return [group["ess"] * (state["hess"] + group["weight_decay"])
                for _, group, state in self._pairs()]

    def sample_offsets(self, generator: torch.Generator | None) -> list[torch.Tensor]:
        """Return theta - m = e / sqrt(lambda (h + delta)), e ~ N(0, I) (Alg. 1 line 3)."""
        return sample_offsets(self.posterior_std(), generator)

    @torch.no_grad()
    def ivon_step(self, grads: Sequence[torch.Tensor], curvature: Sequence[torch.Tensor]) -> None:
        """Apply Alg. 1 lines 6-9 given g and the Hessian estimate h_hat (same shapes)."""
        for (p, group, state), g, f in zip(self._pairs(), grads, curvature):
            b1, b2, wd = group["beta1"], group["beta2"], group["weight_decay"]
            state["step"] += 1
            state["momentum"].mul_(b1).add_(g, alpha=1 - b1)  # line 6
            h = state["hess"]
            # line 7: the improved rule keeps h + delta > 0 (Lin et al. 2020)
            state["hess"] = (b2 * h + (1 - b2) * f
                             + 0.5 * (1 - b2) ** 2 * (h - f).square() / (h + wd))
            debias = 1 - b1 ** state["step"]
            alpha = group["lr"] * (group["hess_init"] + wd)  # lr rescaling (paper, App. A)
            direction = (state["momentum"] / debias + wd * p) / (state["hess"] + wd)  # line 8
            p.sub_(alpha * direction)  # line 9

    def step(self, closure: Callable[[], float] | None = None):  # pragma: no cover - guard
        raise RuntimeError("IVONOptimizer is driven by the ivon/dp_ivon method: "
                           "call ivon_step(grads, curvature)")


class PosteriorSampling(Mechanism):
    """Stage 2 of IVON: S posterior samples theta_s = m + e_s / sqrt(lambda (h + delta)).

    ``posterior_std`` (sigma_v per parameter, from the update's h: post-processing of released
    gradients) is the mechanism's moving parameter, taken in ``advance`` from the update's
    ``public_state()``; the samples' gradients are averaged per example before clipping, so
    any posterior gives one release of the declared sensitivity. The samples reach the update
    as values, in the step context's ``points``.
    """

    def __init__(self, name: str, settings: IVONSettings) -> None:
        super().__init__(name, settings)
        self.posterior_std: list[torch.Tensor] | None = None  # sigma_v, set in advance

    def gradient_evaluations_per_step(self) -> int:
        """Return S = mc_samples: one gradient evaluation per posterior sample."""
        return int(self.settings.mc_samples)

    def evaluation_points(self, ctx: StepContext) -> list[EvalPoint]:
        """Return S posterior samples theta_s = m + e_s / sqrt(lambda (h + delta)), weight 1/S.

        The loop averages the S gradients per example before clipping, so S > 1 costs no
        privacy (docs/ivon.md). The loop hands the points to the update (``ctx.points``) for
        the reparameterised estimate.
        """
        assert self.posterior_std is not None, "advance at set-up takes the posterior"
        s = self.settings.mc_samples
        return [EvalPoint(weight=1.0 / s, offsets=sample_offsets(self.posterior_std,
                                                                  ctx.method_generator))
                for _ in range(s)]

    def advance(self, released: Released) -> None:
        """Take sigma_v from the update's posterior (``public_state()["posterior_std"]``)."""
        self.posterior_std = list(released.public["posterior_std"])


class IVONUpdate(Update):
    """IVON's stage 8 (Alg. 1 lines 5-9) and its Bayesian model averaging at evaluation."""

    settings: IVONSettings

    def __init__(self, name: str, settings: IVONSettings,
                 optimizer: OptimizerFactory | None = None) -> None:
        super().__init__(name, settings, optimizer or IVONOptimizer)
        self._diag = {"steps": 0, "zero_fraction_sum": 0.0, "last_zero_fraction": 0.0}

    def setup(self, params: list[nn.Parameter], info: RunInfo) -> None:
        super().setup(params, info)
        if not isinstance(self.optimizer, IVONOptimizer):
            raise ConfigError(f"method {self.name!r} needs method.optimizer._target_: "
                              "dpbench.methods.ivon.IVONOptimizer "
                              f"(got {type(self.optimizer).__name__})")
        self.optimizer.set_ess(info.dataset_size)  # lambda = N unless set (paper default)

    def public_state(self) -> dict[str, Any]:
        """Return sigma_v = 1 / sqrt(lambda (h + delta)): what the mechanism samples from."""
        return {"posterior_std": self.ivon.posterior_std()}

    @property
    def ivon(self) -> IVONOptimizer:
        assert isinstance(self.optimizer, IVONOptimizer)
        return self.optimizer

    # ---- stage 8: the IVON update --------------------------------------------------------
    def curvature(self, grads: list[torch.Tensor], ctx: StepContext) -> list[torch.Tensor]:
        """Return h_hat: reparam g (theta - m) / sigma_v^2 (Alg. 1 line 5), or gradsq.

        theta - m is this step's posterior sample, handed over as the step's evaluation point
        (``ctx.points``, set by the loop from the mechanism's ``evaluation_points``).
        """
        if self.settings.hess == "reparam":
            if not ctx.points or ctx.points[0].offsets is None:  # no sample: h_hat = 0
                return [torch.zeros_like(g) for g in grads]
            return [g * d * prec for g, d, prec in
                    zip(grads, ctx.points[0].offsets, self.ivon.precision_scale())]
        return self.squared_gradient_curvature(grads, ctx)

    def squared_gradient_curvature(self, grads: list[torch.Tensor],
                                   ctx: StepContext) -> list[torch.Tensor]:
        """Return lambda * v_hat, v_hat = max(g^2 - sigma_w^2, 0) (corrected) or g^2.

        sigma_w^2 = (sigma C / B)^2 = ``ctx.noise_std ** 2`` is the per-coordinate variance of
        the privacy noise in g (docs/ivon.md); it is 0 for a non-private run.
        """
        noise_var = ctx.noise_std ** 2 if self.settings.correction else 0.0
        v_hat = [noise_corrected_square(g, noise_var).clamp(min=0.0) for g in grads]
        zero = sum(int((v == 0).sum()) for v in v_hat)
        total = sum(v.numel() for v in v_hat)
        self._diag["last_zero_fraction"] = zero / max(total, 1)
        ess = [group["ess"] for group in self.ivon.param_groups for _ in group["params"]]
        return [lam * v for lam, v in zip(ess, v_hat)]

    def update(self, grads: list[torch.Tensor], ctx: StepContext) -> None:
        """Apply IVON's momentum, curvature and mean update (Alg. 1 lines 5-9)."""
        self.ivon.ivon_step(grads, self.curvature(grads, ctx))
        self._diag["steps"] += 1
        self._diag["zero_fraction_sum"] += self._diag["last_zero_fraction"]

    # ---- diagnostics ---------------------------------------------------------------------
    def hess_mean(self) -> float:
        hs = self.ivon.hessians()
        return float(sum(h.sum() for h in hs) / max(sum(h.numel() for h in hs), 1))

    def step_metrics(self) -> dict[str, float]:
        out = {"hess_mean": self.hess_mean()}
        if self.settings.hess == "gradsq":
            out["vhat_zero_fraction"] = self._diag["last_zero_fraction"]
        return out

    def summary(self) -> dict[str, Any]:
        steps = max(self._diag["steps"], 1)
        return {"hess": self.settings.hess,
                "mc_samples": self.settings.mc_samples,
                "correction": self.settings.correction,
                "eval_samples": self.settings.eval_samples,
                "hess_mean_final": self.hess_mean(),
                "vhat_zero_fraction_mean": (self._diag["zero_fraction_sum"] / steps
                                            if self.settings.hess == "gradsq" else None)}

    def state_dict(self) -> dict[str, Any]:
        return dict(self._diag)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._diag.update(state)

    # ---- prediction ----------------------------------------------------------------------
    def evaluation_samples(self) -> int:
        """Return S = ``eval_samples``: the posterior samples of Bayesian model averaging."""
        return self.settings.eval_samples

    def evaluation_offsets(self, index: int, device: torch.device) -> list[torch.Tensor]:
        """Return theta_i - m for BMA sample ``index``: regenerated from its own seed
        (``eval_seed``, stream ``method_eval``) each time, so no S x params memory and the
        training noise never moves."""
        gen = stream_generator(self.settings.eval_seed, "method_eval", device, index)
        return self.ivon.sample_offsets(gen)

    def evaluate(self, held_out: HeldOut) -> dict:
        """Return BMA metrics over S posterior samples, plus ``at_mean_*`` metrics at m.

        p(y|x) = (1/S) sum_s softmax(f(x; theta_s)), theta_s ~ q (IVON paper, eq. 4): the
        loop averages the predictions at ``evaluation_offsets`` (``held_out.averaged``). The
        S samples are fixed for the whole evaluation (seeded by ``eval_seed``).
        """
        at_mean = held_out.metrics
        scalars = {k: v for k, v in at_mean.items() if isinstance(v, (int, float))}
        out: dict[str, Any] = {f"at_mean_{k}": v for k, v in scalars.items()}
        if held_out.averaged is None:
            out.update(at_mean)
        else:
            out.update(held_out.averaged)
        out["hess_mean"] = self.hess_mean()
        if self.settings.hess == "gradsq":
            out["vhat_zero_fraction"] = self._diag["last_zero_fraction"]
        return out


#: non-private IVON with the reparameterised Hessian estimate (``hess=reparam``); settings:
#: ``hess`` (reparam | gradsq), ``mc_samples`` (posterior samples per step, their gradients
#: averaged, so reparam needs 1), ``correction`` (gradsq's DP noise correction, ``dp_ivon``),
#: ``eval_samples`` (S for Bayesian model averaging; 0 predicts at the mean) and ``eval_seed``
IVON = register_method(DPMethod("ivon", IVONSettings(), PosteriorSampling, IVONUpdate,
                                private=False, tasks=frozenset({"classification"})))
