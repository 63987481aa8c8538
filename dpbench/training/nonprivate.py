"""What a step computes without privatising: a non-private run's exact gradient, and the
un-privatised diagnostics of any step (not covered by epsilon, docs/privacy-unit-and-streams.md).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dpbench.methods.base import Mechanism, StepContext
from dpbench.tasks.base import Task
from dpbench.training.batches import batch_size, physical_chunks, select_rows
from dpbench.training.distributed import Collective
from dpbench.training.engine.protocol import finite_losses
from dpbench.training.step import ONE_PROCESS, Release
from dpbench.utils.stats import quantile_summary
from dpbench.utils.tensors import parameters_at


def nonprivate_gradient(mechanism: Mechanism, model: torch.nn.Module, params, task: Task, batch,
                        ctx: StepContext, max_physical: int | None, *,
                        collective: Collective | None = None) -> Release:
    """Return the exact mean gradient of the realised batch (no clipping, no noise).

    K processes: each rank's sum over its slice, summed over the ranks, over the global count.
    """
    collective = collective or ONE_PROCESS
    n = batch_size(batch)
    sums = [torch.zeros_like(p) for p in params]
    losses = []
    points = tuple(mechanism.evaluation_points(ctx))  # once per step, as the DP path
    for chunk in (physical_chunks(batch, max_physical) if n > 0 else []):
        for point in points:
            with parameters_at(params, point.offsets):
                for p in params:
                    p.grad = None
                loss = _finite_loss(task, model, chunk)  # the same drop policy as DP runs
                (point.weight * loss.sum()).backward()
                for s, p in zip(sums, params):
                    if p.grad is not None:
                        s.add_(p.grad)
            losses.append(loss.detach())
    for p in params:
        p.grad = None
    collective.sum_(sums)
    n = collective.count(n, sums[0].device if sums else "cpu")
    grads = [s / max(n, 1) for s in sums]
    kept = torch.cat(losses) if losses else torch.zeros(0)
    return Release(grads=grads, queries=[], realised_batch=n, points=points,
                   losses=collective.cat(kept, sums[0].device if sums else "cpu"))


def _finite_loss(task: Task, model: torch.nn.Module, batch) -> torch.Tensor:
    """Return the per-example losses of the examples whose loss is finite (graph attached).

    The others are dropped by recomputing without them: masking alone would still
    back-propagate 0 * NaN into every parameter.
    """
    while True:
        loss = task.per_example_loss(model, batch)
        finite = finite_losses(loss)  # the engines' drop rule (engine/protocol.py)
        if bool(finite.all()):
            return loss
        batch = select_rows(batch, finite.nonzero().flatten())


def step_diagnostics(release: Release, task: Task, quantiles: bool = True) -> dict[str, Any]:
    """Return a step's un-privatised diagnostics of the kept examples (non-finite ones are
    dropped): the realised batch size, the mean loss, the clip fraction and norm quantiles
    (only with ``quantiles``: the loop asks for them when a sink logs them), and the task's
    own. Sinks leave them out unless asked (docs/privacy-unit-and-streams.md).
    """
    out: dict[str, Any] = {
        "batch_size": release.realised_batch,
        "loss": float(release.losses.mean()) if release.losses.numel() else math.nan}
    if release.norms is not None and release.norms.numel():
        out["clip_fraction"] = release.clipped_fraction
        if quantiles:
            out.update(quantile_summary("grad_norm", release.norms))
    out.update(task.step_metrics())
    return out
