"""Small summary statistics shared by the loop and the tasks."""

from __future__ import annotations

import torch


def quantile_summary(prefix: str, values: torch.Tensor) -> dict[str, float]:
    """Return {prefix_p50, _p90, _p99, _max} of ``values`` (empty for no values)."""
    if values.numel() == 0:
        return {}
    q = torch.quantile(values.detach().double().cpu(),
                       torch.tensor([0.5, 0.9, 0.99, 1.0], dtype=torch.float64))
    return {f"{prefix}_p50": float(q[0]), f"{prefix}_p90": float(q[1]),
            f"{prefix}_p99": float(q[2]), f"{prefix}_max": float(q[3])}
