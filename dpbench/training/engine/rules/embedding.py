"""Book-keeping's rule for ``nn.Embedding`` (padding row, repeated tokens).

Example i's gradient of the table adds ``g_it`` into row ``x_it`` for every token t, so
``||G_i||^2 = sum_{t,s} [x_t = x_s] g_t . g_s``: the ghost norm of a linear layer on one-hot
inputs (Bu et al., ICML 2023, eq. 4, with ``a_t . a_s = [x_t = x_s]``), never forming the
V x d gradient. The clipped sum adds the re-weighted ``f_i g_it`` into their rows (eq. 5).
Per user the same sum runs over the tokens of all the user's examples (``UserRows.tokens``).
"""

from __future__ import annotations

import torch
from torch import nn

from dpbench.training.engine.rules.base import (
    Calls,
    Kept,
    LayerRule,
    Tensor,
    UserRows,
    layer_rule,
    weighted,
)


def _grad_out(m: nn.Embedding, calls: Calls) -> tuple[Tensor, Tensor]:
    """Return (indices [B, T], output grads [B, T, d]) of the calls concatenated along T, the
    padding row's grads zeroed."""
    b = calls[0].a.shape[0]
    idx = torch.cat([c.a.reshape(b, -1) for c in calls], dim=1) if len(calls) > 1 else \
        calls[0].a.reshape(b, -1)
    g = torch.cat([c.g.reshape(b, -1, c.g.shape[-1]) for c in calls], dim=1) \
        if len(calls) > 1 else calls[0].g.reshape(b, -1, calls[0].g.shape[-1])
    if m.padding_idx is not None:
        g = g * (idx != m.padding_idx).unsqueeze(-1).to(g.dtype)
    return idx, g


def _ghost_norm_sq(idx: Tensor, g: Tensor) -> Tensor:
    """Return sum_{t,s} [x_t = x_s] g_t . g_s per row of idx [B, T], g [B, T, d]."""
    same = (idx.unsqueeze(2) == idx.unsqueeze(1)).to(g.dtype)
    return (same * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))


@layer_rule(nn.Embedding)
class EmbeddingRule(LayerRule):
    def norm_sq(self, m: nn.Embedding, calls: Calls, keep: Kept | None = None) -> Tensor:
        """Return ||grad E||^2 per example: sum_{t,s} [x_t = x_s] g_t . g_s (ghost; V d is
        large)."""
        return _ghost_norm_sq(*_grad_out(m, calls))

    per_user = True

    def user_norm_sq(self, m: nn.Embedding, calls: Calls, rows: UserRows) -> Tensor:
        """Return per-user ||D_u||^2: the same ghost sum over the user's tokens concatenated
        (a padded slot has index 0 and a zero output gradient: it adds nothing)."""
        idx, g = _grad_out(m, calls)
        return _ghost_norm_sq(rows.ids_tokens(idx), rows.tokens(g))

    def clipped(self, m: nn.Embedding, calls: Calls, f: Tensor) -> dict[nn.Parameter, Tensor]:
        """Return sum_i f_i grad_i: re-weighted output grads added into their rows."""
        idx, g = _grad_out(m, calls)
        gw = weighted(g, f)
        out = torch.zeros_like(m.weight).index_add_(0, idx.reshape(-1),
                                                    gw.reshape(-1, g.shape[-1]))
        return {m.weight: out}

    def check(self, m: nn.Module, cls: type) -> str | None:
        """Refuse frequency-scaled and sparse gradients (not the sum above)."""
        if m.scale_grad_by_freq or m.sparse:
            return "Embedding with scale_grad_by_freq or sparse gradients"
        return None
