"""Book-keeping's rule for ``nn.Linear`` (any leading token dims).

``G_i = sum_t g_it a_it^T`` (Bu et al., ICML 2023, eq. 2): the per-example norm by the ghost
norm ``<a_i a_i^T, g_i g_i^T>`` (their eq. 4) or by instantiation, whichever costs fewer
multiply-adds (their sec. 3.3); the clipped sum ``(f g)^T a`` (their eq. 5). Several calls in
one forward are concatenated along the token axis (exact: eq. 2 is a sum over tokens).
Per user, ``D_u = sum_{i in u} sum_t g_it a_it^T`` is the same sum over the user's examples'
tokens concatenated (``UserRows.tokens``), so the same norm applies to the regrouped rows.
"""

from __future__ import annotations

import torch
from torch import nn

from dpbench.training.engine.rules.base import (
    Call,
    Calls,
    Kept,
    LayerRule,
    Tensor,
    UserRows,
    gram_norm_sq,
    layer_rule,
    sq,
    weighted,
)


def token_merged(calls: Calls) -> tuple[Tensor, Tensor]:
    """Return (a, g) of the calls concatenated along the token axis (exact for a layer whose
    per-example gradient is a sum over tokens, eq. 2); one call is returned as it is."""
    if len(calls) == 1:
        return calls[0].a, calls[0].g
    b = calls[0].a.shape[0]
    a = torch.cat([c.a.reshape(b, -1, c.a.shape[-1]) for c in calls], dim=1)
    g = torch.cat([c.g.reshape(b, -1, c.g.shape[-1]) for c in calls], dim=1)
    return a, g


@layer_rule(nn.Linear)
class LinearRule(LayerRule):
    concat_calls = True

    def norm_sq(self, m: nn.Linear, calls: Calls, keep: Kept | None = None) -> Tensor:
        """Return per-example ||grad W||^2 + ||grad b||^2 (trainable ones)."""
        a, g = token_merged(calls)
        has_bias = m.bias is not None and m.bias.requires_grad
        if a.dim() == 2:  # T = 1: ||g a^T||^2 + ||g||^2 = ||g||^2 (||a||^2 + 1), few ops (MLPs)
            g_sq = sq(g)
            if not m.weight.requires_grad:
                return g_sq
            a_sq = sq(a)
            return g_sq * (a_sq + 1.0) if has_bias else g_sq * a_sq
        b = a.shape[0]
        out = torch.zeros(b, dtype=g.dtype, device=g.device)
        a3, g3 = a.reshape(b, -1, a.shape[-1]), g.reshape(b, -1, g.shape[-1])
        t, d_in, d_out = a3.shape[1], a3.shape[2], g3.shape[2]
        if m.weight.requires_grad:
            if t * (d_in + d_out) <= d_in * d_out:  # ghost: T^2 (d_in + d_out) <= T d_in d_out
                out = out + gram_norm_sq(a3, g3)
            else:
                out = out + sq(torch.bmm(g3.transpose(1, 2), a3))
        if has_bias:
            out = out + g3.sum(1).pow(2).sum(1)
        return out

    per_user = True

    def user_norm_sq(self, m: nn.Linear, calls: Calls, rows: UserRows) -> Tensor:
        """Return per-user ||D_u||^2: ``norm_sq`` of the user as one example whose tokens are
        its examples' tokens (zero-padded to the largest user: zero tokens add nothing)."""
        a, g = token_merged(calls)
        return self.norm_sq(m, [Call(rows.tokens(a), rows.tokens(g))])

    def clipped(self, m: nn.Linear, calls: Calls, f: Tensor) -> dict[nn.Parameter, Tensor]:
        """Return sum_i f_i grad_i for the layer's trainable parameters (one matmul each)."""
        a, g = token_merged(calls)
        out = {}
        if a.dim() == 2:  # W: (g^T diag f) a; b: g^T f
            gt = g.t()
            if m.weight.requires_grad:
                out[m.weight] = torch.mm(gt * f, a)
            if m.bias is not None and m.bias.requires_grad:
                out[m.bias] = torch.mv(gt, f)
            return out
        gw = weighted(g, f).reshape(-1, g.shape[-1])
        if m.weight.requires_grad:
            out[m.weight] = gw.t() @ a.reshape(-1, a.shape[-1])
        if m.bias is not None and m.bias.requires_grad:
            out[m.bias] = gw.sum(0)
        return out
