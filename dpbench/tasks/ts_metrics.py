"""Metrics of probabilistic imputation/forecasting on the target entries (original scale).

Point metrics use the median of the S samples (CSDI, Tashiro et al. 2021). CRPS is the exact
CRPS of the empirical sample distribution, ``E|X - y| - 0.5 E|X - X'|`` (Gneiting & Raftery
2007, eq. 21). JS is the Jensen-Shannon divergence (base 2, in [0, 1]) between histograms of
generated and real target values per channel. The ACF distance is the mean absolute difference
between autocorrelation functions (lags 1..max_lag) of the real window and the window with
its targets replaced by the point estimate.
"""

from __future__ import annotations

import math

import torch


def point_metrics(pred: torch.Tensor, y: torch.Tensor, mask: torch.Tensor,
                  mape_eps: float = 1e-2) -> dict[str, float]:
    """Return RMSE, MAE and MAPE (%) over entries with mask 1; MAPE skips |y| <= mape_eps."""
    m = mask.bool()
    err = (pred - y)[m]
    if err.numel() == 0:
        return {"rmse": math.nan, "mae": math.nan, "mape": math.nan}
    yt = y[m]
    keep = yt.abs() > mape_eps
    mape = float(((err[keep]).abs() / yt[keep].abs()).mean() * 100) if keep.any() else math.nan
    return {"rmse": float(err.pow(2).mean().sqrt()), "mae": float(err.abs().mean()),
            "mape": mape}


def crps_empirical(samples: torch.Tensor, y: torch.Tensor, mask: torch.Tensor
                   ) -> dict[str, float]:
    """Return mean CRPS per target entry and the normalised sum CRPS / sum |y|.

    ``samples`` is [S, ...] with the shape of ``y`` after the first dimension.
    """
    m = mask.bool()
    s = samples[:, m]  # [S, n]
    yt = y[m]
    if yt.numel() == 0:
        return {"crps": math.nan, "crps_normalized": math.nan}
    term1 = (s - yt).abs().mean(dim=0)
    term2 = (s.unsqueeze(0) - s.unsqueeze(1)).abs().mean(dim=(0, 1))
    crps = term1 - 0.5 * term2
    return {"crps": float(crps.mean()),
            "crps_normalized": float(crps.sum() / yt.abs().sum().clamp_min(1e-12))}


def js_divergence(p_values: torch.Tensor, q_values: torch.Tensor, bins: int = 50) -> float:
    """Return JS(P || Q) in bits between histograms on a shared range."""
    lo = float(torch.minimum(p_values.min(), q_values.min()))
    hi = float(torch.maximum(p_values.max(), q_values.max()))
    if hi <= lo:
        return 0.0
    p = torch.histc(p_values.double(), bins, lo, hi)
    q = torch.histc(q_values.double(), bins, lo, hi)
    p, q = p / p.sum(), q / q.sum()
    mix = 0.5 * (p + q)

    def kl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        nz = a > 0
        return (a[nz] * torch.log2(a[nz] / b[nz])).sum()

    return float(0.5 * kl(p, mix) + 0.5 * kl(q, mix))


def channel_js(samples: torch.Tensor, y: torch.Tensor, mask: torch.Tensor,
               bins: int = 50) -> float:
    """Return the JS divergence per channel (last dim), averaged over channels with targets."""
    m = mask.bool()
    values = []
    for k in range(y.shape[-1]):
        mk = m[..., k]
        if mk.any():
            values.append(js_divergence(samples[..., k][:, mk].flatten(), y[..., k][mk], bins))
    return sum(values) / len(values) if values else math.nan


def autocorrelation(x: torch.Tensor, max_lag: int) -> torch.Tensor:
    """Return ACF lags 1..max_lag along dim 1 of [n, L, K] (0 for a constant series)."""
    xc = x - x.mean(dim=1, keepdim=True)
    var = xc.pow(2).sum(dim=1)
    safe = torch.where(var > 0, var, torch.ones_like(var))
    lags = [torch.where(var > 0, (xc[:, k:] * xc[:, :-k]).sum(dim=1) / safe, 0.0)
            for k in range(1, max_lag + 1)]
    return torch.stack(lags, dim=1)  # [n, lags, K]


def acf_distance(pred_full: torch.Tensor, y: torch.Tensor, max_lag: int = 10) -> float:
    """Return mean |ACF(pred) - ACF(real)| over windows, channels and lags 1..max_lag."""
    lag = min(max_lag, y.shape[1] - 1)
    diff = (autocorrelation(pred_full.double(), lag) - autocorrelation(y.double(), lag)).abs()
    return float(diff.mean()) if diff.numel() else math.nan

