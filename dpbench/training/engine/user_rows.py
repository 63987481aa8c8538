"""A batch's rows grouped by user: what the per-user paths of ``bk`` and ``ghost`` read.

A user's gradient is the sum of its examples' gradients, ``D_u = sum_{i in u} g_i``. For a
layer whose per-example gradient is a sum over positions, ``G_i = sum_t g_it a_it^T``
(Bu et al., ICML 2023, eq. 2; Goodfellow 2015), ``D_u = sum_{i in u} sum_t g_it a_it^T``: the
user is ONE example whose positions are the concatenation of its examples' positions. So
``regroup`` lays each user's rows side by side, ``[B, ...] -> [U, n_max, ...]``, zero-padded
to the largest user of the batch (a zero row adds nothing to any sum over positions), and
``tokens`` flattens them into one long sequence, ``[U, n_max * T, d]``; the layer's own rule
(ghost norm ``<A A^T, G G^T>`` or instantiation) then gives ``||D_u||^2`` cross terms
included. Where a rule instantiates per-example gradients (small parameters), ``sums`` adds
them per user (``index_add``). The rows of a user need not be contiguous.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class UserRows:
    """Rows of a batch grouped by user id (ascending ids, as ``torch.unique`` sorts them)."""

    ids: torch.Tensor  # [U] the users, ascending (CPU)
    inverse: torch.Tensor  # [B] the index in ``ids`` of each row's user (CPU)
    slot: torch.Tensor  # [B] the row's position among its user's rows (CPU)
    width: int  # the largest user's number of rows in this batch
    #: ``inverse`` and ``slot`` on the device the engine computes on (one copy a batch)
    at_inverse: torch.Tensor | None = None
    at_slot: torch.Tensor | None = None

    @classmethod
    def of(cls, users: torch.Tensor, device: torch.device | None = None) -> UserRows:
        """Return the grouping of rows whose user ids are ``users`` [B] (index copies on
        ``device``, the engine's, when given)."""
        users = users.detach().cpu().to(torch.int64)
        ids, inverse, counts = torch.unique(users, sorted=True, return_inverse=True,
                                            return_counts=True)
        order = torch.argsort(inverse, stable=True)
        starts = torch.cumsum(counts, 0) - counts
        slot = torch.empty_like(inverse)
        slot[order] = torch.arange(len(users)) - torch.repeat_interleave(starts, counts)
        width = int(counts.max()) if len(counts) else 0
        if device is None or torch.device(device).type == "cpu":
            return cls(ids, inverse, slot, width)
        return cls(ids, inverse, slot, width, inverse.to(device), slot.to(device))

    def _on(self, x: torch.Tensor, device: torch.device) -> torch.Tensor:
        """Return index ``x`` (``inverse`` or ``slot``) on ``device``, the cached copy if any."""
        cached = self.at_inverse if x is self.inverse else self.at_slot
        if cached is not None and cached.device == device:
            return cached
        return x if x.device == device else x.to(device)

    @property
    def count(self) -> int:
        return len(self.ids)

    def sums(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``[U, ...]``: the sum of each user's rows of ``x`` [B, ...]."""
        out = torch.zeros((self.count, *x.shape[1:]), dtype=x.dtype, device=x.device)
        return out.index_add_(0, self._on(self.inverse, x.device), x)

    def regroup(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``[U, width, ...]``: each user's rows of ``x`` [B, ...] side by side, the
        empty slots zero (or index 0 for integer inputs: their output gradients are zero)."""
        out = x.new_zeros((self.count, self.width, *x.shape[1:]))
        out[self._on(self.inverse, x.device), self._on(self.slot, x.device)] = x
        return out

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``[U, width * T, d]`` from ``x`` [B, ..., d] (positions ``...`` flattened
        into T; a [B, d] input is one position): each user as one long example."""
        b, d = x.shape[0], x.shape[-1]
        return self.regroup(x.reshape(b, -1, d)).reshape(self.count, -1, d)

    def ids_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``[U, width * T]`` from integer positions ``x`` [B, ...] (token indices)."""
        return self.regroup(x.reshape(x.shape[0], -1)).reshape(self.count, -1)

    def per_row(self, f: torch.Tensor) -> torch.Tensor:
        """Return each row's user's value of ``f`` [U] (a user's clip factor for its rows)."""
        return f[self._on(self.inverse, f.device)]
