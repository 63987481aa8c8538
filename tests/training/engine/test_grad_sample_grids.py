"""Opacus's per-layer grids as property tests of dpbench's engines.

The families of ``tests/helpers/engine_grid.py`` draw from the strategies of Opacus's
``opacus/tests/grad_samples/*_test.py``. For every draw and engine the outcome must be exact
(norms and clipped sums against a float64 one-example-at-a-time reference, at the tolerance of
``tests/helpers/numerics.py``) or a refusal before any release; never a silently wrong result or a
crash. Where book-keeping's rules claim the layer (batch-first Linear, Conv2d, Embedding,
LayerNorm, GroupNorm) it must run and be exact. Two seeded draws per family run in the fast
suite; the whole grid (``hypothesis``, 60 draws per family) is ``slow``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import engine_grid as grid
from tests.helpers.grid_checks import assert_exact, assert_neighbours

COMMON = dict(deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
FULL = settings(max_examples=60, **COMMON)


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
        assert_exact(run, name)
        if mode == "auto":
            assert_neighbours(case, run)


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
