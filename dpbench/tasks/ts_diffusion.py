"""Conditional DDPM for time-series imputation and forecasting (CSDI-like).

Training (Ho et al. 2020, eq. 14; Tashiro et al. 2021, eq. 6): per example draw a step
t ~ U{0..T-1}, noise eps ~ N(0, I) and (imputation) a fresh target mask, form
x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps on the target entries and take
``loss_i = sum_target (eps - eps_theta(x_t, t | c))^2 / #targets``. The condition holds only
observed non-target values, their mask and calendar covariates.

The draws use the loop's ``task`` stream (its own spawned seed, checkpointed by the loop).
A step that evaluates the gradient at several points (DiSK/FIBER) sees the same draws at every
point: they are cached for the batch object the loop passes to each point.

Evaluation: S ancestral samples per window (Ho et al. 2020, Alg. 2) from a fixed generator,
with the predicted x_0 clamped to +-``clip_denoised`` scaled units (the reference DDPM code's
``clip_denoised``; null disables it); the point estimate is the median of the samples;
metrics in ``ts_metrics`` on the original scale.
Gradient diagnostics (private runs, ``gradient_diagnostics: true``): per-example norms of the
conditioning pathway (condition encoder + modulation layers) and of the rest, the clip rate
and clip severity, logged per step and summarised at each evaluation into results.json's
``unprivatised_diagnostics`` (never ``metrics``). They are computed on private data and are not
privatised: diagnostics only, like the training loss.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from dpbench.data.timeseries import WindowSpec, draw_target_mask
from dpbench.errors import ConfigError
from dpbench.models.dit import is_conditioning_parameter
from dpbench.tasks import register_task
from dpbench.tasks.base import Task
from dpbench.tasks.ts_metrics import (
    acf_distance,
    channel_js,
    crps_empirical,
    point_metrics,
)
from dpbench.utils.seeding import stream_generator
from dpbench.utils.stats import quantile_summary
from dpbench.utils.tensors import move_to

NORM_SAMPLE_SIZE = 2000  # per-example norms kept per evaluation for histograms


def noise_schedule(steps: int, beta_start: float, beta_end: float, kind: str) -> torch.Tensor:
    """Return betas [T]: ``quad`` (CSDI: linspace of sqrt beta, squared) or ``linear``."""
    if kind == "quad":
        return torch.linspace(beta_start ** 0.5, beta_end ** 0.5, steps, dtype=torch.float64) ** 2
    if kind == "linear":
        return torch.linspace(beta_start, beta_end, steps, dtype=torch.float64)
    raise ConfigError(f"task.schedule must be quad or linear (got {kind!r})")


@register_task("ts_diffusion")
class TimeSeriesDiffusion(Task):
    """Per-example DDPM loss on target entries; sampling-based evaluation and metrics."""

    def __init__(self, data: Any = None, diffusion_steps: int = 50, beta_start: float = 1e-4,
                 beta_end: float = 0.5, schedule: str = "quad", num_samples: int = 8,
                 eval_seed: int = 0, mape_eps: float = 1e-2, js_bins: int = 50,
                 acf_lags: int = 10, clip_denoised: float | None = 5.0,
                 gradient_diagnostics: bool = True,
                 resample_train_masks: bool = True, **settings: Any) -> None:
        super().__init__(data, **settings)
        if diffusion_steps < 1 or num_samples < 1:
            raise ConfigError("task.diffusion_steps and task.num_samples must be >= 1")
        if not 0 < beta_start < beta_end < 1:
            raise ConfigError("task needs 0 < beta_start < beta_end < 1")
        betas = noise_schedule(diffusion_steps, beta_start, beta_end, schedule)
        self.betas = betas.float()
        self.alpha_bars = torch.cumprod(1 - betas, dim=0).float()
        self.num_samples, self.eval_seed = num_samples, eval_seed
        self.clip_denoised = clip_denoised
        self.mape_eps, self.js_bins, self.acf_lags = mape_eps, js_bins, acf_lags
        self.observes_gradients = bool(gradient_diagnostics)
        self.observes_norms_only = True  # g_cond / g_rest / g_total are sums of squares
        self.resample_train_masks = resample_train_masks
        extras = getattr(data, "extras", {}) or {}
        self.spec: WindowSpec = extras.get("window_spec") or WindowSpec()
        self.loc = torch.tensor(extras.get("loc", [0.0]))
        self.scale = torch.tensor(extras.get("scale", [1.0]))
        self._cache: tuple[Any, tuple] | None = None
        self._diag: dict[str, list[torch.Tensor]] = {}
        self._step: dict[str, list[torch.Tensor]] = {}

    # ---- training ------------------------------------------------------------------------
    @staticmethod
    def condition_inputs(values: torch.Tensor, observed: torch.Tensor,
                         target_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (conditional values, conditional mask): observed entries that are not targets."""
        cond_mask = observed * (1 - target_mask)
        return values * cond_mask, cond_mask

    def _draws(self, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return (target mask, step t, noise eps) for ``batch``; the same for the same batch."""
        if self._cache is not None and self._cache[0] is batch:
            return self._cache[1]
        values, observed, target = batch[0], batch[1], batch[2]
        # One seed per example from the loop's task stream (checkpointed by the loop), then
        # each example's mask, step and noise from its own generator.
        seeds = torch.randint(0, 2**62, (values.shape[0],), generator=self.generator).tolist()
        masks, steps, noises = [], [], []
        for i, seed in enumerate(seeds):
            gen = torch.Generator().manual_seed(seed)
            one_observed = observed[i:i + 1].cpu()
            masks.append(draw_target_mask(one_observed, self.spec, gen)
                         if self.resample_train_masks else target[i:i + 1].cpu())
            steps.append(torch.randint(0, len(self.betas), (1,), generator=gen))
            noises.append(torch.randn(one_observed.shape, generator=gen))
        device = values.device
        target = torch.cat(masks).to(device=device, dtype=values.dtype) if seeds else target
        t = torch.cat(steps).to(device) if seeds else torch.zeros(0, dtype=torch.long,
                                                                    device=device)
        eps = torch.cat(noises).to(device=device, dtype=values.dtype) if seeds else \
            torch.zeros_like(values)
        self._cache = (batch, (target, t, eps))
        return target, t, eps

    def per_example_loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        values, observed, _, covariates = batch
        target, t, eps = self._draws(batch)
        abar = self.alpha_bars.to(values.device)[t].view(-1, 1, 1)
        noisy = (abar.sqrt() * values + (1 - abar).sqrt() * eps) * target
        cond_values, cond_mask = self.condition_inputs(values, observed, target)
        eps_hat = model(noisy, target, t, cond_values, cond_mask, covariates)
        sq = ((eps - eps_hat) * target).pow(2).flatten(1).sum(dim=1)
        return sq / target.flatten(1).sum(dim=1).clamp_min(1.0)

    # ---- sampling ------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, model: nn.Module, batch, num_samples: int,
               generator: torch.Generator | None = None) -> torch.Tensor:
        """Return [S, n, L, K] samples of the target entries (scaled units; 0 elsewhere)."""
        values, observed, target, covariates = batch
        n = values.shape[0]
        rep = lambda x: x.repeat(num_samples, *([1] * (x.dim() - 1)))  # noqa: E731
        cond_values, cond_mask = self.condition_inputs(values, observed, target)
        target_r, cv, cm, cov = rep(target), rep(cond_values), rep(cond_mask), rep(covariates)
        betas = self.betas.to(values.device)
        abars = self.alpha_bars.to(values.device)
        x = torch.randn(target_r.shape, generator=generator, device=values.device)
        for step in reversed(range(len(betas))):
            t = torch.full((x.shape[0],), step, device=x.device, dtype=torch.long)
            eps_hat = model(x * target_r, target_r, t, cv, cm, cov)
            beta, abar = betas[step], abars[step]
            abar_prev = abars[step - 1] if step > 0 else torch.ones_like(abar)
            x0 = (x - (1 - abar).sqrt() * eps_hat) / abar.sqrt()
            if self.clip_denoised is not None:
                x0 = x0.clamp(-self.clip_denoised, self.clip_denoised)
            # posterior mean of q(x_{t-1} | x_t, x0) (Ho et al. 2020, eq. 7)
            x = (beta * abar_prev.sqrt() * x0 + (1 - abar_prev) * (1 - beta).sqrt() * x) / (
                1 - abar)
            if step > 0:
                var = beta * (1 - abar_prev) / (1 - abar)
                x = x + var.sqrt() * torch.randn(x.shape, generator=generator, device=x.device)
        return (x * target_r).view(num_samples, n, *values.shape[1:])

    # ---- evaluation ----------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader: Any, device: torch.device,
                 predict: Any = None) -> dict[str, Any]:
        """Return RMSE/MAE/MAPE/CRPS/JS/ACF distance on the original scale (test data only)."""
        was_training = model.training
        model.eval()
        gen = stream_generator(self.eval_seed, "task_eval", device)
        ys, masks, samples = [], [], []
        for batch in loader:
            batch = move_to(batch, device)
            draw = (predict or (lambda b: self.sample(model, b, self.num_samples, gen)))(batch)
            ys.append(batch[0].cpu())
            masks.append(batch[2].cpu())
            samples.append(draw.cpu())
        model.train(was_training)
        y_scaled, mask, s_scaled = torch.cat(ys), torch.cat(masks), torch.cat(samples, dim=1)
        return self.metrics(s_scaled, y_scaled, mask)

    def unscale(self, x: torch.Tensor) -> torch.Tensor:
        """Return values on the original scale: x * scale + loc (per channel)."""
        return x * self.scale + self.loc

    def metrics(self, samples: torch.Tensor, y_scaled: torch.Tensor,
                mask: torch.Tensor) -> dict[str, float]:
        """Return every metric from [S, n, L, K] scaled samples and the scaled truth."""
        y = self.unscale(y_scaled)
        s = self.unscale(samples)
        median = s.median(dim=0).values
        out = point_metrics(median, y, mask, self.mape_eps)
        out.update(crps_empirical(s, y, mask))
        out["js"] = channel_js(s, y, mask, self.js_bins)
        filled = torch.where(mask.bool(), median, y)
        out["acf_distance"] = acf_distance(filled, y, self.acf_lags)
        return out

    def primary_metric(self) -> tuple[str, str]:
        return "rmse", "min"

    # ---- gradient diagnostics (hook of the loop; off unless observes_gradients) -----------
    def observe_per_example_gradients(self, named_grads: Mapping[str, torch.Tensor],
                                      norms: torch.Tensor, clip_norm: float) -> None:
        """Record ||g_cond,i||, ||g_rest,i||, ||g_i|| of one chunk (diagnostics only)."""
        cond = torch.zeros_like(norms)
        rest = torch.zeros_like(norms)
        for name, g in named_grads.items():
            sq = g.reshape(g.shape[0], -1).pow(2).sum(dim=1)
            if is_conditioning_parameter(name):
                cond += sq
            else:
                rest += sq
        for key, v in (("g_cond", cond.sqrt()), ("g_rest", rest.sqrt()), ("g_total", norms),
                       ("clip_norm", torch.full_like(norms, clip_norm))):
            v = v.detach().cpu()
            self._diag.setdefault(key, []).append(v)
            self._step.setdefault(key, []).append(v)

    def state_dict(self) -> dict[str, Any]:
        """Return the diagnostics accumulated since the last evaluation."""
        return {"diag": {k: torch.cat(v) for k, v in self._diag.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._diag = {k: [v] for k, v in (state.get("diag") or {}).items()}

    def step_metrics(self) -> dict[str, float]:
        """Return this step's g_cond quantiles, clip rate and severity (all its chunks)."""
        if not self._step:
            return {}
        d = {k: torch.cat(v) for k, v in self._step.items()}
        self._step = {}
        return {**quantile_summary("g_cond", d["g_cond"]),
                **clip_summary(d["g_total"], d["clip_norm"])}

    def diagnostics_summary(self) -> dict[str, Any]:
        """Return norm quantiles, clip rate/severity and a norm sample of every step since the
        last evaluation (the whole run when only the last epoch is evaluated); reset.

        Checkpointed with the run (``state_dict``), so a resumed run summarises every step.
        """
        if not self._diag:
            return {}
        d = {k: torch.cat(v) for k, v in self._diag.items()}
        self._diag = {}
        out: dict[str, Any] = {}
        for key in ("g_cond", "g_rest", "g_total"):
            out.update(quantile_summary(key, d[key]))
        out.update(clip_summary(d["g_total"], d["clip_norm"]))
        stride = max(1, math.ceil(len(d["g_cond"]) / NORM_SAMPLE_SIZE))
        out["g_cond_norms"] = [round(float(v), 6) for v in d["g_cond"][::stride]]
        out["g_total_norms"] = [round(float(v), 6) for v in d["g_total"][::stride]]
        return out


def clip_summary(norms: torch.Tensor, clip_norm: float | torch.Tensor) -> dict[str, float]:
    """Return clip rate (share with ||g_i|| > C) and severity (mean ||g_i||/C when clipped)."""
    ratio = norms / clip_norm
    clipped = ratio > 1
    return {"clip_rate": float(clipped.float().mean()) if norms.numel() else math.nan,
            "clip_severity": float(ratio[clipped].mean()) if clipped.any() else math.nan}
