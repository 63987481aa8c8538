"""The one call every per-example engine answers, and the one rule for dropping an example.

An engine (docs/engine.md) turns per-example losses at the method's evaluation points into
what the Gaussian release needs (Abadi et al. 2016, Algorithm 1, before the noise):

    clipped_sum(loss_fn, batch, points, factors_fn) -> ClippedSum(
        sums    = sum_i f_i d_i per parameter, d_i = sum_k w_k g_i(theta + delta_k),
        norms   = ||d_i||, factors = f_i = factors_fn(||d_i||) (the method's clip factors),
        losses  = the kept examples' losses at the first point, kept = the mask of kept rows)

Engines that materialise per-example gradients say so (``materialises``) and offer them
(``per_example``); the others refuse that call in one line. The loop, the step and the
per-run check call only this protocol and read only these attributes, never an engine's name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

import torch
from torch import nn

from dpbench.errors import ConfigError
from dpbench.registry import Registry

LossFn = Callable[[nn.Module, Any], torch.Tensor]
FactorsFn = Callable[[torch.Tensor], torch.Tensor]
#: receives the kept examples' per-parameter (materialised) or per-layer (book-keeping)
#: gradient rows and their norms: un-privatised task diagnostics only
Observer = Callable[[dict[str, torch.Tensor], torch.Tensor], None]


class Point(Protocol):
    """An evaluation point: ``weight`` w_k in the combination, ``offsets`` delta_k or None."""

    weight: float
    offsets: Sequence[torch.Tensor] | None


class ClippedSum(NamedTuple):
    """What an engine returns for one physical batch (rows of dropped examples are 0)."""

    sums: list[torch.Tensor]  # sum_i f_i d_i, one tensor per trainable parameter
    norms: torch.Tensor  # [B] ||d_i|| (0 for a dropped example)
    factors: torch.Tensor  # [B] f_i (0 for a dropped example)
    losses: torch.Tensor  # the kept examples' losses at the first point
    kept: torch.Tensor  # [B] bool on the CPU: the examples that contribute


class Engine(Protocol):
    """The per-example engine protocol (module doc)."""

    #: ``trainer.grad_sample_mode`` this engine runs (results.json's ``grad_sample_mode``)
    mode: str
    #: whether ``per_example`` returns per-example gradients (B x params)
    materialises: bool
    #: whether ``clipped_sum`` takes several evaluation points (their combination's norm)
    combines_points_supported: bool
    #: whether it hands norms and sums over in the parameters' float32 (bf16-mixed runs)
    float32_handover: bool
    #: whether ``clipped_user_sum`` forms each user's gradient sum before its norm
    #: (privacy.unit=user, user-level sampling: ``per_user.py``)
    per_user_supported: bool
    #: the run combines several evaluation points (the per-run check checks that path too)
    combines_points: bool
    params: list[nn.Parameter]
    names: list[str]

    def clipped_sum(self, loss_fn: LossFn, batch: Any, points: Sequence[Point],
                    factors_fn: FactorsFn, observe: Observer | None = None) -> ClippedSum: ...

    def per_example(self, loss_fn: LossFn, batch: Any) -> tuple[list[torch.Tensor],
                                                                 torch.Tensor]: ...

    def clipped_user_sum(self, loss_fn: LossFn, batch: Any, users: torch.Tensor,
                         points: Sequence[Point], factors_fn: FactorsFn) -> ClippedSum: ...

    def close(self) -> None: ...


def kept_examples(norms: torch.Tensor, losses: Sequence[torch.Tensor] = ()) -> torch.Tensor:
    """Return the mask (on ``norms``' device) of the examples that contribute to a release.

    THE drop rule of every engine and of the non-private path: example i is kept when its
    loss at every evaluation point and the norm of its (combined) gradient are finite; a
    dropped example contributes exactly 0 to every sum and query (a NaN would otherwise
    reach the release). ``norms`` may have more rows than a loss (the audit's canary rows
    have no loss of their own); a loss covers the first rows.
    """
    kept = torch.isfinite(norms)
    for loss in losses:
        kept[:len(loss)] &= torch.isfinite(loss.detach()).to(kept.device)
    return kept


def finite_losses(loss: torch.Tensor) -> torch.Tensor:
    """Return the drop rule for rows that have a loss but no gradient norm yet (CPU mask)."""
    return kept_examples(torch.zeros(len(loss), device=loss.device), [loss]).cpu()


def zero_rows(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Return ``x`` [B, ...] with the rows outside ``keep`` zeroed (indices left as they are:
    ``torch.where``, not a product, so that 0 * inf does not make NaN)."""
    if not x.is_floating_point():  # an embedding's token indices
        return x
    return torch.where(keep.to(x.device).view(-1, *([1] * (x.dim() - 1))), x,
                       torch.zeros_like(x))


def per_example_refused(mode: str) -> ConfigError:
    """Return the one-line refusal of ``per_example`` by an engine forming clipped sums only."""
    return ConfigError(f"trainer.grad_sample_mode={mode} forms clipped sums, not per-example "
                      "gradients; this run needs them: use trainer.grad_sample_mode=hooks "
                      "(or auto)")


def combined_gradients(per_example: Callable[[LossFn, Any], tuple[list[torch.Tensor],
                                                                   torch.Tensor]],
                       params: Sequence[nn.Parameter], loss_fn: LossFn, batch: Any,
                       points: Sequence[Point]) -> tuple[list[torch.Tensor],
                                                         list[torch.Tensor]]:
    """Return (the rows' combination ``u_i = sum_k w_k g_i(theta + delta_k)`` per parameter,
    the losses at each point) from an engine's materialised ``per_example`` call
    (docs/adding-a-method.md, stage 4)."""
    from dpbench.utils.tensors import parameters_at

    combined, losses = None, []
    for point in points:
        with parameters_at(params, point.offsets):
            grads, point_loss = per_example(loss_fn, batch)
        losses.append(point_loss)
        if combined is None:
            combined = grads if point.weight == 1.0 else [point.weight * g for g in grads]
        else:
            for c, g in zip(combined, grads):
                c.add_(g, alpha=point.weight)
    return combined, losses


def flat_norms(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """Return ||r_j||_2 over all parameters for each row j (per-example or per-user)."""
    norms = [torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1) for g in rows]
    return torch.linalg.vector_norm(torch.stack(norms, dim=0), dim=0)


def trainable(model: nn.Module) -> tuple[list[nn.Parameter], list[str]]:
    """Return the trainable parameters of ``model`` and their names, in the model's order."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [p for _, p in named], [n for n, _ in named]


#: the engine class of each resolved ``trainer.grad_sample_mode`` (``choice`` builds them)
ENGINES: Registry[type[Engine]] = Registry("engine")
E = TypeVar("E", bound=type)


def register_engine(cls: E) -> E:
    """Class decorator: register an engine under its ``mode``; a second one is refused."""
    return ENGINES.register(cls.mode)(cls)
