"""Opacus's per-layer grids as property tests of dpbench's engines.

The families of ``tests/training/engine_grid.py`` draw from the strategies of Opacus's
``opacus/tests/grad_samples/*_test.py``. For every draw and engine the outcome must be exact
(norms and clipped sums against a float64 one-example-at-a-time reference, at the tolerance of
``tests/numerics.py``) or a refusal before any release; never a silently wrong result or a
crash. Where book-keeping's rules claim the layer (batch-first Linear, Conv2d, Embedding,
LayerNorm, GroupNorm) it must run and be exact. Two seeded draws per family run in the fast
suite; the whole grid (``hypothesis``, 60 draws per family) is ``slow``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpbench.methods.base import StepContext
from dpbench.methods.dpsgd import DPSGD
from dpbench.training.step import SENSITIVITY_SLACK, clipped_aggregate
from tests.numerics import assert_matches_reference, tolerance
from tests.training import engine_grid as grid

COMMON = dict(deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
FULL = settings(max_examples=60, **COMMON)


#: a parameter whose reference sum is below this fraction of the whole sum's norm is held to
#: the tolerance relative to the whole sum (an exactly zero gradient, e.g. attention's key
#: bias under softmax's shift invariance, is float32 rounding alone in every engine)
FLOOR = 1e-6


def _assert_exact(run: grid.Run, name: str) -> None:
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


def check_case(case: grid.Case) -> None:
    """The properties every engine must have on ``case``."""
    for mode in ("bk", "hooks", "auto"):
        run = grid.run_case(case, mode)
        name = f"{case.name} [{mode}]"
        assert run.status != "crashed", f"{name}: crashed: {run.engine}"
        if run.status == "refused":
            assert not (case.bk_claims and mode in ("bk", "auto")), \
                f"{name}: refused a layer book-keeping claims: {run.engine}"
            continue
        _assert_exact(run, name)
        if mode == "auto":
            _assert_neighbours(case, run)


class _Task:
    observes_gradients = False

    @staticmethod
    def per_example_loss(model, batch):
        return grid.loss_fn(model, batch)


def _assert_neighbours(case: grid.Case, run: grid.Run) -> None:
    """Removing one example moves the loop's pre-noise sum by at most C (DP-SGD)."""
    x, r = run.batch
    n = len(x)
    c = run.clip
    ctx = StepContext(step=0, epoch=0, private=True, noise_multiplier=1.0, clip_norm=c,
                      expected_batch_size=float(n), sample_rate=0.5, dataset_size=2 * n,
                      total_steps=1)
    method, engine = DPSGD(), run.engine_obj
    full = clipped_aggregate(method, engine, _Task(), (x, r), ctx, 1.0, None).sums
    for drop in range(n):
        keep = torch.tensor([i for i in range(n) if i != drop], dtype=torch.long)
        part = clipped_aggregate(method, engine, _Task(), (x[keep], r[keep]), ctx, 1.0,
                                 None).sums
        moved = torch.sqrt(sum(((a - b).double().pow(2).sum() for a, b in zip(full, part)),
                               torch.zeros((), dtype=torch.float64)))
        assert float(moved) <= c * (1 + SENSITIVITY_SLACK), \
            f"{case.name}: removing example {drop} moved the sum by {float(moved) / c:.3g} C"


def _property(family: str, data) -> None:
    torch.manual_seed(data.draw(st.integers(0, 2**16)))
    case = grid.FAMILIES[family](grid.HypothesisDraw(data))
    if case is None:  # an invalid combination (Opacus skips them too)
        return
    check_case(case)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("family", list(grid.FAMILIES))
def test_grid_sample_is_exact_or_refused(family, seed):
    """Two seeded draws per family from the same strategies (hypothesis's first draws are the
    minimal ones, which several families skip as invalid)."""
    draw = grid.RandomDraw(1000 * seed + list(grid.FAMILIES).index(family))
    torch.manual_seed(seed)
    for _ in range(20):  # the first valid combination of this seed
        case = grid.FAMILIES[family](draw)
        if case is not None:
            check_case(case)
            return
    pytest.fail(f"no valid {family} draw")


@pytest.mark.slow
@pytest.mark.parametrize("family", list(grid.FAMILIES))
@FULL
@given(data=st.data())
def test_whole_grid_is_exact_or_refused(family, data):
    _property(family, data)
