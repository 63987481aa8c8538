"""A diffusion transformer of AdaLN-Zero blocks for time series, with the DP-aware bounds.

Huang et al., "DP-aware AdaLN-Zero" (arXiv 2602.22610); DiT blocks from Peebles & Xie (2023).
Tokens are time steps. The condition c (one vector per token) is built only from the observed
values, the observation mask and the calendar covariates (plus the diffusion-step embedding);
the noisy target enters as the token input, never through c. Each block computes

    h = h + alpha_1 * Attn(LN(h) (1 + gamma_1) + beta_1)
    h = h + alpha_2 * MLP (LN(h) (1 + gamma_2) + beta_2)

with (gamma, beta, alpha) from a zero-initialised linear map of c, so a fresh block is the
identity. DP-aware (``dp_aware=true``):

    c~ = c * min(1, c_max / ||c||_2)                 (per example, over all its tokens)
    gamma = M_g tanh(gamma_raw / M_g), beta = M_b tanh(.), alpha = M_a tanh(.)

Every parameter sits in an ``nn.Linear`` (attention is written from ``nn.Linear``; LayerNorms
carry no affine parameters), so Opacus's hook samplers give exact per-example gradients.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dpbench.errors import ConfigError
from dpbench.models import register_model


def is_conditioning_parameter(name: str) -> bool:
    """Return whether a parameter is on the conditioning pathway (encoder + modulation)."""
    return name.startswith(("cond_encoder.", "step_embed.")) or ".modulation." in name


def sinusoidal(positions: torch.Tensor, dim: int,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Return [..., dim] sinusoidal embeddings of ``positions`` (Vaswani et al. 2017)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0)
                      * torch.arange(half, device=positions.device, dtype=dtype) / half)
    args = positions.to(dtype).unsqueeze(-1) * freqs
    emb = torch.cat([torch.sin(args), torch.cos(args)], dim=-1)
    return nn.functional.pad(emb, (0, dim - 2 * half))


class Bounds:
    """The DP-aware bounds (c_max, M_gamma, M_beta, M_alpha); ``enabled`` false = vanilla."""

    def __init__(self, enabled: bool = False, c_max: float = 1.0, m_gamma: float = 1.0,
                 m_beta: float = 1.0, m_alpha: float = 1.0) -> None:
        for key, v in (("c_max", c_max), ("m_gamma", m_gamma), ("m_beta", m_beta),
                       ("m_alpha", m_alpha)):
            if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
                raise ConfigError(f"model.{key} must be a finite number > 0 (got {v!r})")
        self.enabled, self.c_max = bool(enabled), float(c_max)
        self.m_gamma, self.m_beta, self.m_alpha = float(m_gamma), float(m_beta), float(m_alpha)

    def project(self, c: torch.Tensor) -> torch.Tensor:
        """Return c~ = c * min(1, c_max / ||c||_2), the norm over each example's whole c."""
        if not self.enabled:
            return c
        norm = c.flatten(1).norm(dim=1).clamp_min(1e-12)
        factor = (self.c_max / norm).clamp(max=1.0)
        return c * factor.view(-1, *([1] * (c.dim() - 1)))

    @staticmethod
    def squash(x: torch.Tensor, m: float) -> torch.Tensor:
        """Return M tanh(x / M): smooth, |.| < M, and the identity to first order at 0.
        At M = 1 that is tanh(x) exactly (x / 1 and 1 * y are exact), two ops fewer."""
        return torch.tanh(x) if m == 1.0 else m * torch.tanh(x / m)

    def modulation(self, gamma, beta, alpha):
        """Return (gamma, beta, alpha), each bounded coordinate-wise when enabled."""
        if not self.enabled:
            return gamma, beta, alpha
        return (self.squash(gamma, self.m_gamma), self.squash(beta, self.m_beta),
                self.squash(alpha, self.m_alpha))


class SelfAttention(nn.Module):
    """Multi-head self-attention from ``nn.Linear`` (Opacus rejects nn.MultiheadAttention)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ConfigError(f"model.hidden ({dim}) must be divisible by model.heads ({heads})")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.heads), dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, n, d))


class AdaLNZeroBlock(nn.Module):
    """One DiT block with AdaLN-Zero modulation from the (bounded) condition."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float, bounds: Bounds) -> None:
        super().__init__()
        self.bounds = bounds
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = SelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        nn.init.zeros_(self.modulation[1].weight)  # AdaLN-Zero: the block starts as identity
        nn.init.zeros_(self.modulation[1].bias)

    def modulations(self, c: torch.Tensor):
        """Return the six (bounded) modulation tensors [B, L, d] from c~.

        With one bound for all three (the default M = 1), the squash is elementwise with the
        same M, so it runs once on the joined [B, L, 6d] output: the same numbers, one op
        instead of six.
        """
        b = self.bounds
        out = self.modulation(c)
        if b.enabled and b.m_gamma == b.m_beta == b.m_alpha:
            return b.squash(out, b.m_gamma).chunk(6, dim=-1)
        g1, b1, a1, g2, b2, a2 = out.chunk(6, dim=-1)
        return (*b.modulation(g1, b1, a1), *b.modulation(g2, b2, a2))

    def forward(self, h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        g1, b1, a1, g2, b2, a2 = self.modulations(c)
        h = h + a1 * self.attn(self.norm1(h) * (1 + g1) + b1)
        return h + a2 * self.mlp(self.norm2(h) * (1 + g2) + b2)


class ConditionEncoder(nn.Module):
    """c = MLP([observed values * mask, mask, covariates]) per token: targets excluded."""

    def __init__(self, channels: int, time_features: int, dim: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2 * channels + time_features, dim), nn.SiLU(),
                                 nn.Linear(dim, dim))

    def forward(self, cond_values: torch.Tensor, cond_mask: torch.Tensor,
                covariates: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([cond_values * cond_mask, cond_mask, covariates], dim=-1))


class FinalLayer(nn.Module):
    """AdaLN (shift, scale) then a zero-initialised linear read-out (DiT's final layer)."""

    def __init__(self, dim: int, out: int, bounds: Bounds) -> None:
        super().__init__()
        self.bounds = bounds
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))
        self.linear = nn.Linear(dim, out)
        for layer in (self.modulation[1], self.linear):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        gamma, beta = self.modulation(c).chunk(2, dim=-1)
        if self.bounds.enabled:
            gamma = self.bounds.squash(gamma, self.bounds.m_gamma)
            beta = self.bounds.squash(beta, self.bounds.m_beta)
        return self.linear(self.norm(h) * (1 + gamma) + beta)


class TimeSeriesDiT(nn.Module):
    """epsilon_theta(x_t, t | c): predicts the noise on the target entries, [B, L, K]."""

    def __init__(self, channels: int, time_features: int, hidden: int = 32, depth: int = 2,
                 heads: int = 2, mlp_ratio: float = 2.0, bounds: Bounds | None = None) -> None:
        super().__init__()
        self.bounds = bounds or Bounds()
        self.hidden = hidden
        self.input = nn.Linear(2 * channels, hidden)  # [noisy target, target mask]
        self.cond_encoder = ConditionEncoder(channels, time_features, hidden)
        self.step_embed = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(),
                                        nn.Linear(hidden, hidden))
        self.blocks = nn.ModuleList(AdaLNZeroBlock(hidden, heads, mlp_ratio, self.bounds)
                                    for _ in range(depth))
        self.final = FinalLayer(hidden, channels, self.bounds)

    def set_dp_aware(self, enabled: bool, **bounds: float) -> None:
        """Switch the DP-aware bounds on or off (and optionally change them) in place."""
        new = Bounds(enabled, **{"c_max": self.bounds.c_max, "m_gamma": self.bounds.m_gamma,
                                 "m_beta": self.bounds.m_beta, "m_alpha": self.bounds.m_alpha,
                                 **{k: v for k, v in bounds.items() if v is not None}})
        self.bounds.__dict__.update(new.__dict__)  # shared by every block

    def condition(self, step: torch.Tensor, cond_values: torch.Tensor, cond_mask: torch.Tensor,
                  covariates: torch.Tensor) -> torch.Tensor:
        """Return c~ [B, L, d]: encoder(observed, mask, covariates) + step embedding, bounded."""
        c = self.cond_encoder(cond_values, cond_mask, covariates)
        c = c + self.step_embed(sinusoidal(step, self.hidden, c.dtype)).unsqueeze(1)
        return self.bounds.project(c)

    def forward(self, noisy: torch.Tensor, target_mask: torch.Tensor, step: torch.Tensor,
                cond_values: torch.Tensor, cond_mask: torch.Tensor,
                covariates: torch.Tensor) -> torch.Tensor:
        c = self.condition(step, cond_values, cond_mask, covariates)
        h = self.input(torch.cat([noisy * target_mask, target_mask], dim=-1))
        h = h + sinusoidal(torch.arange(h.shape[1], device=h.device), self.hidden, h.dtype)
        for block in self.blocks:
            h = block(h, c)
        return self.final(h, c)


@register_model("dit")
def time_series_dit(input_shape, num_classes: int = 0, hidden: int = 32, depth: int = 2,
                    heads: int = 2, mlp_ratio: float = 2.0, dp_aware: bool = False,
                    c_max: float = 1.0, m_gamma: float = 1.0, m_beta: float = 1.0,
                    m_alpha: float = 1.0, data=None) -> nn.Module:
    """Return the AdaLN-Zero diffusion transformer for [L, K] windows (``model=dit``)."""
    if len(input_shape) != 2:
        raise ConfigError(f"model=dit needs a time-series data set with [window, channels] "
                          f"inputs (got input shape {tuple(input_shape)})")
    features = int((data.extras if data is not None else {}).get("num_time_features", 5))
    return TimeSeriesDiT(input_shape[1], features, hidden, depth, heads, mlp_ratio,
                         Bounds(dp_aware, c_max, m_gamma, m_beta, m_alpha))
