"""Spectral gradient denoising (Dadsetan and Rudzicz, arXiv 2510.01137; docs/dp-lora-spectral.md).

After the Gaussian release every selected 2-D gradient G~ (n x m) = G + E, E_ij ~ N(0, s^2)
with s = sigma C / B (``ctx.noise_std``), is denoised by Gavish-Donoho optimal shrinkage of its
singular values (Gavish and Donoho, IEEE TIT 2017, arXiv 1405.7511, Frobenius loss, known noise
level) and rescaled to the noisy gradient's Frobenius norm. Pure post-processing of the released
gradient: no privacy cost, epsilon identical to the baseline.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any

import torch
from torch import nn

from dpbench.errors import ConfigError
from dpbench.method_settings.spectral_denoise import SpectralDenoiseSettings
from dpbench.methods import register_method
from dpbench.methods.base import (
    DPMethod,
    OptimizerFactory,
    RunInfo,
    StepContext,
    Update,
)


def optimal_shrinkage(singular_values: torch.Tensor, noise_std: float | torch.Tensor, n: int,
                      m: int) -> torch.Tensor:
    """Return the Frobenius-optimal shrunk singular values (Gavish-Donoho 2017, eq. 7).

    For an n x m matrix with i.i.d. N(0, s^2) noise (unnormalised form of their
    eta(y) = sqrt((y^2 - beta - 1)^2 - 4 beta) / y with y = s_i / (s sqrt(max(n, m))),
    beta = n / m):
    ``s_i' = sqrt((s_i^2 - s^2 (n + m))^2 - 4 s^4 n m) / s_i`` if ``s_i >= s (sqrt n + sqrt m)``,
    else 0 (the bulk edge of the noise's Marchenko-Pastur law).
    """
    s2 = torch.as_tensor(noise_std, dtype=singular_values.dtype,
                         device=singular_values.device) ** 2
    y2 = singular_values.pow(2)
    radicand = (y2 - s2 * (n + m)).pow(2) - 4 * s2.pow(2) * n * m
    edge = torch.as_tensor(noise_std, dtype=singular_values.dtype,
                           device=singular_values.device) * (math.sqrt(n) + math.sqrt(m))
    shrunk = radicand.clamp(min=0).sqrt() / singular_values.clamp(min=torch.finfo(
        singular_values.dtype).tiny)
    return torch.where(singular_values >= edge, shrunk, torch.zeros_like(shrunk))


def denoise_matrices(noisy: torch.Tensor, noise_std: float, kappa: float = 1.0
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (denoised [k, n, m], gate passed [k]) for a stack of k noisy n x m gradients.

    Per matrix (docs/dp-lora-spectral.md): batched fp32 SVD; if the top singular value is
    <= kappa * s * (sqrt n + sqrt m) the matrix is returned unchanged; else every singular value
    is shrunk by :func:`optimal_shrinkage`, the matrix rebuilt U diag(s') V^T and rescaled to
    ||G~||_F (norm-preserving). A matrix whose shrunk values are all zero is left unchanged.
    """
    k, n, m = noisy.shape
    work = noisy.float()
    u, sv, vh = torch.linalg.svd(work, full_matrices=False)
    gate = sv[:, 0] > kappa * noise_std * (math.sqrt(n) + math.sqrt(m))
    shrunk_sv = optimal_shrinkage(sv, noise_std, n, m)
    rebuilt = (u * shrunk_sv.unsqueeze(1)) @ vh
    rebuilt_norm = rebuilt.flatten(1).norm(dim=1)
    noisy_norm = work.flatten(1).norm(dim=1)
    keep = gate & (rebuilt_norm > 0)
    scale = torch.where(keep, noisy_norm / rebuilt_norm.clamp(min=torch.finfo(
        work.dtype).tiny), torch.ones_like(noisy_norm))
    out = torch.where(keep[:, None, None], rebuilt * scale[:, None, None], work)
    return out.to(noisy.dtype), keep


class SpectralShrinkage(Update):
    """Stage 7: each selected 2-D released gradient denoised; then the YAML's optimiser."""

    def __init__(self, name: str, settings: SpectralDenoiseSettings,
                 optimizer: OptimizerFactory | None = None) -> None:
        super().__init__(name, settings, optimizer)
        self.selected: list[int] = []
        self._metrics: dict[str, float] = {}
        self.denoise_seconds = 0.0
        self.totals = {"steps": 0.0, "cosine": 0.0, "passed": 0.0}

    def _is_target(self, name: str, p: torch.Tensor) -> bool:
        if p.dim() != 2 or min(p.shape) < 2:
            return False
        targets = self.settings.targets
        if targets == "all_2d":
            return True
        if targets == "lora":
            return "lora_A" in name or "lora_B" in name
        return any(t in name for t in targets)

    def setup(self, params: list[nn.Parameter], info: RunInfo) -> None:
        super().setup(params, info)
        names = info.param_names or ("",) * len(params)  # the loop's, in the order of params
        self.selected = [i for i, (name, p) in enumerate(zip(names, params))
                         if self._is_target(name, p)]
        if not self.selected:
            raise ConfigError(f"spectral_denoise: no trainable 2-D parameter matches "
                              f"targets={self.settings.targets!r} (is the model LoRA? use "
                              f"targets=all_2d otherwise)")

    def postprocess(self, grads: list[torch.Tensor], ctx: StepContext) -> list[torch.Tensor]:
        """Return the released gradients with each selected matrix denoised (free: stage 7)."""
        if not ctx.private or ctx.noise_std <= 0:
            return grads
        start = time.perf_counter()
        out = list(grads)
        by_shape: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for i in self.selected:
            by_shape[tuple(grads[i].shape)].append(i)
        passed, dot, noisy_sq, clean_sq = 0, 0.0, 0.0, 0.0
        for idx in by_shape.values():
            stack = torch.stack([grads[i] for i in idx])
            denoised, keep = denoise_matrices(stack, ctx.noise_std, self.settings.kappa)
            passed += int(keep.sum())
            dot += float((denoised * stack).sum())
            noisy_sq += float(stack.pow(2).sum())
            clean_sq += float(denoised.pow(2).sum())
            for j, i in enumerate(idx):
                out[i] = denoised[j]
        elapsed = time.perf_counter() - start
        self.denoise_seconds += elapsed
        self.totals["steps"] += 1
        self.totals["cosine"] += dot / max(math.sqrt(noisy_sq * clean_sq), 1e-30)
        self.totals["passed"] += passed
        self._metrics = {
            "denoise_cosine": dot / max(math.sqrt(noisy_sq * clean_sq), 1e-30),
            "denoise_passed": float(passed),
            "denoise_matrices": float(len(self.selected)),
            "denoise_seconds": elapsed,
        }
        return out

    def step_metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def summary(self) -> dict[str, Any]:
        steps = max(self.totals["steps"], 1.0)
        return {"denoised_matrices": len(self.selected),
                "denoise_seconds_total": self.denoise_seconds,
                "denoise_cosine_mean": self.totals["cosine"] / steps,
                "denoise_passed_mean": self.totals["passed"] / steps}

    def state_dict(self) -> dict[str, Any]:
        return {"denoise_seconds": self.denoise_seconds, "totals": dict(self.totals)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.denoise_seconds = state.get("denoise_seconds", 0.0)
        self.totals.update(state.get("totals", {}))


#: DP-SGD/DP-Adam (optimiser from the YAML) whose stage 7 denoises each selected 2-D gradient:
#: ``targets`` ``lora`` (the LoRA factors A and B, by parameter name), ``all_2d`` (every 2-D
#: trainable gradient) or a list of substrings of parameter names; ``kappa`` scales the gate
SPECTRAL_DENOISE = register_method(DPMethod("spectral_denoise", SpectralDenoiseSettings(),
                                            update_cls=SpectralShrinkage))
