"""Per-user clipping: each user's gradient SUM formed before its norm is clipped to C.

User-level DP-SGD (user-level sampling, ULS; Charles et al. 2024, "Fine-Tuning Large Language
Models with User-Level Differential Privacy", Alg. 1 with the sum as the user's update; the
same as DP-SGD run over users, Abadi et al. 2016, Alg. 1, with a user as the unit) releases

    sum_u min(1, C / ||D_u||) D_u + N(0, sigma^2 C^2 I),    D_u = sum_{i in u} d_i,

where d_i is example i's (combined) gradient. Adding or removing one user moves the pre-noise
sum by at most C, which is the sensitivity the DP-SGD-over-users accountant assumes. The
user's SUM (not its mean) is clipped: the sensitivity is C whatever the number of the user's
examples in the batch, and a user with more examples is not down-weighted before the clip.

Every built-in engine forms D_u before its norm:

- ``hooks``, ``functorch`` materialise per-example gradients and add them per user
  (``clip_per_user``);
- ``bk`` (``bookkeeping.BookKeepingEngine.clipped_user_sum``) and ``ghost``
  (``ghost.GhostClippingEngine.clipped_user_sum``) never form D_u: a layer's per-example
  gradient is a sum over positions, ``G_i = sum_t g_it a_it^T``, so a user's is the same sum
  over its examples' positions concatenated, and the layer's ghost norm
  ``||D_u||^2 = sum_{t,t'} (g_t . g_t')(a_t . a_t')`` (Goodfellow 2015; Li et al. 2022;
  Bu et al. 2023, eq. 4) runs on the user's rows regrouped as one long example
  (``user_rows``); the clipped sum re-weights every example of u by ``c_u``.

An engine without a per-user path is refused in one line (``per_user_refusal``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from dpbench.training.engine.protocol import (
    ClippedSum,
    FactorsFn,
    LossFn,
    Point,
    combined_gradients,
    flat_norms,
    kept_examples,
    zero_rows,
)

PerExampleFn = Callable[[LossFn, Any], tuple[list[torch.Tensor], torch.Tensor]]


def per_user_refusal(mode: str) -> str:
    """Return the one-line refusal of per-user clipping by an engine of ``mode``."""
    return (f"trainer.grad_sample_mode={mode} forms per-example norms only, but "
            "privacy.unit=user with privacy.user_strategy=uls clips each user's gradient "
            "sum (its norm needs every cross term of the user's examples): use "
            "trainer.grad_sample_mode=hooks, functorch or auto")


def user_sums(per_example: Sequence[torch.Tensor], users: torch.Tensor
              ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Return (D_u per parameter [U, *p.shape], the user ids in that order) from the rows'
    gradients [B, *p.shape] and their user ids [B]: D_u = sum of u's rows (``index_add``)."""
    ids, inverse = torch.unique(users.cpu(), sorted=True, return_inverse=True)
    sums = []
    for g in per_example:
        out = torch.zeros((len(ids), *g.shape[1:]), dtype=g.dtype, device=g.device)
        sums.append(out.index_add_(0, inverse.to(g.device), g))
    return sums, ids


def clip_per_user(per_example: PerExampleFn, params: Sequence[nn.Parameter], loss_fn: LossFn,
                  batch: Any, users: torch.Tensor, points: Sequence[Point],
                  factors_fn: FactorsFn, *, broken_sum_after_clip: bool = False
                  ) -> ClippedSum:
    """Return ``ClippedSum`` of users: sums = sum_u f_u D_u, norms = ||D_u||, factors f_u,
    ``kept`` one entry per user (a user with no kept example contributes 0).

    An example whose loss or gradient is not finite is dropped first (the rule of every
    engine, ``protocol.kept_examples``): it adds nothing to its user's sum.

    ``broken_sum_after_clip`` is a TEST-ONLY fault (the audit's and the per-run check's
    tests): it clips each example and then sums per user, so a user's contribution can reach
    k C. It is never set by a run's configuration.
    """
    combined, losses = combined_gradients(per_example, params, loss_fn, batch, points)
    example_norms = flat_norms(combined)
    kept_rows = kept_examples(example_norms, losses).cpu()
    loss = losses[0]
    if not bool(kept_rows.all()):
        combined = [zero_rows(c, kept_rows) for c in combined]
        loss = loss[kept_rows[:len(loss)].to(loss.device)]
    if broken_sum_after_clip:  # TEST-ONLY: clip examples, then sum (wrong sensitivity)
        example_norms = torch.where(kept_rows.to(example_norms.device), example_norms,
                                    torch.zeros_like(example_norms))
        f = factors_fn(example_norms)
        combined = [c * f.to(c.dtype).view(-1, *([1] * (c.dim() - 1))) for c in combined]
    sums_u, ids = user_sums(combined, users)
    norms = flat_norms(sums_u)
    kept_u = torch.zeros(len(ids), dtype=torch.bool)
    kept_u.index_fill_(0, torch.unique(torch.searchsorted(ids, users.cpu()[kept_rows])), True)
    factors = torch.ones_like(norms) if broken_sum_after_clip else factors_fn(norms)
    factors = torch.where(kept_u.to(factors.device), factors, torch.zeros_like(factors))
    norms = torch.where(kept_u.to(norms.device), norms, torch.zeros_like(norms))
    sums = [torch.einsum("u,u...->...", factors.to(s.dtype), s) for s in sums_u]
    return ClippedSum(sums, norms, factors, loss, kept_u)
