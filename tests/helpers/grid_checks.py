"""What every engine must satisfy on a case of the layer grids: exact norms and clipped sums,
and the sensitivity bound of the loop's own release."""

from __future__ import annotations

import torch

from dpbench.methods.base import StepContext
from dpbench.methods.dpsgd import DPSGD
from dpbench.training.step import SENSITIVITY_SLACK, clipped_aggregate, plan_at
from tests.helpers import engine_grid as grid
from tests.helpers.numerics import assert_matches_reference, tolerance

#: a parameter whose reference sum is below this fraction of the whole sum's norm is held to
#: the tolerance relative to the whole sum (an exactly zero gradient, e.g. attention's key
#: bias under softmax's shift invariance, is float32 rounding alone in every engine)
FLOOR = 1e-6


def assert_exact(run: grid.Run, name: str) -> None:
    assert run.status == "ran", f"{name}: {run.status}: {run.engine}"
    assert_matches_reference(run.norms, run.ref_norms, dtype=torch.float32,
                             reduction=run.reduction, per_row=True, name=f"{name} norms")
    whole = float(torch.sqrt(sum((r.pow(2).sum() for r in run.ref_sums),
                                 torch.zeros((), dtype=torch.float64))))
    for i, (got, ref) in enumerate(zip(run.sums, run.ref_sums)):
        label = f"{name} clipped sum of parameter {i}"
        if float(ref.norm()) < FLOOR * whole:
            err = float((got.double() - ref).norm()) / whole
            tol = tolerance(torch.float32, run.reduction)
            assert err <= tol, f"{label}: error {err:.3g} of the whole sum > {tol:.3g}"
            continue
        assert_matches_reference(got, ref, dtype=torch.float32, reduction=run.reduction,
                                 name=label)


class _Task:
    observes_gradients = False

    @staticmethod
    def per_example_loss(model, batch):
        return grid.loss_fn(model, batch)


def assert_neighbours(case: grid.Case, run: grid.Run) -> None:
    """Removing one example moves the loop's pre-noise sum by at most C (DP-SGD)."""
    x, r = run.batch
    n = len(x)
    c = run.clip
    ctx = StepContext(step=0, epoch=0, private=True, noise_multiplier=1.0, clip_norm=c,
                      expected_batch_size=float(n), sample_rate=0.5, dataset_size=2 * n,
                      total_steps=1)
    method, engine = DPSGD.halves().mechanism, run.engine_obj
    plan = plan_at(method, 1.0, float(n))
    full = clipped_aggregate(method, engine, _Task(), (x, r), ctx, plan, None).sums
    for drop in range(n):
        keep = torch.tensor([i for i in range(n) if i != drop], dtype=torch.long)
        part = clipped_aggregate(method, engine, _Task(), (x[keep], r[keep]), ctx, plan,
                                 None).sums
        moved = torch.sqrt(sum(((a - b).double().pow(2).sum() for a, b in zip(full, part)),
                               torch.zeros((), dtype=torch.float64)))
        assert float(moved) <= c * (1 + SENSITIVITY_SLACK), \
            f"{case.name}: removing example {drop} moved the sum by {float(moved) / c:.3g} C"
