"""Portable numerical comparisons for tests: a low-precision result against a float64 reference.

A float32 result depends on which CPU kernels PyTorch picks (``ATEN_CPU_CAPABILITY``: the
baseline set, AVX2, AVX-512): their reductions round in a different order. Two float32
computations compared element by element at a fixed ``rtol`` therefore test the kernels, not
the code, and fail on another machine. These helpers instead compare a result with a float64
reference of the same quantity (the model in ``double()``, the one-at-a-time reference in
float64), norm-wise, at a tolerance derived from ``torch.finfo(dtype).eps`` and the length of
the longest reduction behind the result:

    ||actual - reference|| <= safety * eps(dtype) * sqrt(reduction) * ||reference||

``sqrt(reduction)`` is the typical growth of rounding error over a sum of ``reduction`` terms
(the worst case is linear; ``safety`` covers depth and the gap to the worst case). With
``per_row=True`` each leading-index slice (one example's gradient) is held to the bound
separately, so one wrong example cannot hide inside a large total.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

#: default headroom over sqrt(n) eps: a few layers of compounding plus the worst-case gap
SAFETY = 64.0


def tolerance(dtype: torch.dtype, reduction: int = 1, safety: float = SAFETY) -> float:
    """Return the relative norm-wise tolerance for a ``dtype`` result of a length-n reduction."""
    return safety * torch.finfo(dtype).eps * math.sqrt(max(int(reduction), 1))


def relative_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """Return ||actual - reference|| / ||reference|| in float64 (0/0 is 0)."""
    a = actual.detach().to(torch.float64)
    r = reference.detach().to(torch.float64)
    diff = float((a - r).norm())
    scale = float(r.norm())
    if scale == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / scale


def assert_matches_reference(actual: torch.Tensor, reference: torch.Tensor, *,
                             dtype: torch.dtype | None = None, reduction: int = 1,
                             safety: float = SAFETY, per_row: bool = False,
                             name: str = "") -> float:
    """Assert ``actual`` equals the float64 ``reference`` within :func:`tolerance`.

    ``dtype`` is the precision ``actual`` was computed in (default: its own dtype). Returns the
    worst relative error seen, for tests that also report it.
    """
    if reference.dtype != torch.float64:
        raise TypeError(f"{name or 'reference'}: the reference must be float64, "
                        f"got {reference.dtype}")
    if tuple(actual.shape) != tuple(reference.shape):
        raise AssertionError(f"{name}: shape {tuple(actual.shape)} != reference "
                             f"{tuple(reference.shape)}")
    tol = tolerance(dtype or actual.dtype, reduction, safety)
    if not per_row or reference.dim() == 0:
        err = relative_error(actual, reference)
        assert err <= tol, f"{name}: relative error {err:.3g} > tolerance {tol:.3g}"
        return err
    a = actual.detach().to(torch.float64).reshape(len(actual), -1)
    r = reference.detach().reshape(len(reference), -1)
    row_err = (a - r).norm(dim=1)
    row_scale = r.norm(dim=1)
    # a row whose reference is (near) zero is judged against a floor of the typical row norm,
    # not against its own zero norm, where any rounding would be an infinite relative error
    floor = 1e-3 * float(row_scale.pow(2).mean().sqrt())
    rel = row_err / row_scale.clamp_min(floor if floor > 0 else 1.0)
    worst = float(rel.max()) if len(rel) else 0.0
    assert worst <= tol, (f"{name}: row {int(rel.argmax())} relative error {worst:.3g} > "
                          f"tolerance {tol:.3g}")
    return worst


def float64_copy(model: nn.Module) -> nn.Module:
    """Return a float64 deep copy of ``model`` (the reference runs on it)."""
    return copy.deepcopy(model).double()


def one_at_a_time_grads(model: nn.Module, loss_of_example, n: int) -> list[list[torch.Tensor]]:
    """Return, for each of ``n`` examples, the gradients of ``loss_of_example(model, i)``.

    Plain autograd, one example per backward: the reference per-example gradients. Parameters
    that get no gradient give zeros. Run it on :func:`float64_copy` for a float64 reference.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for i in range(n):
        grads = torch.autograd.grad(loss_of_example(model, i), params, allow_unused=True)
        out.append([torch.zeros_like(p) if g is None else g.detach()
                    for p, g in zip(params, grads)])
    return out


def float64_batch(batch):
    """Return ``batch`` (a tensor, or a tuple or list of them) with its floating tensors in float64.

    Integer tensors (labels, token ids, time steps) and anything else (``None``) are left as
    they are.
    """
    if isinstance(batch, torch.Tensor):
        return batch.double() if batch.is_floating_point() else batch
    if isinstance(batch, (tuple, list)):
        return type(batch)(float64_batch(t) for t in batch)
    return batch


def assert_trajectory_matches(actual, reference, *, dtype: torch.dtype = torch.float32,
                              reduction: int = 1, safety: float = SAFETY,
                              name: str = "") -> float:
    """Assert each step of a low-precision trajectory matches its float64 reference.

    ``actual`` and ``reference`` are sequences of tensors (the parameters, flattened, after each
    step; or a loss per step). The rounding errors of ``k`` steps add up, so step ``k`` (from 1)
    is held to ``k`` times :func:`tolerance`: a bound that grows linearly, as for a
    contraction-free update (small learning rates), and still fails on a wrong step.
    Returns the worst ratio of error to bound seen.
    """
    actual, reference = list(actual), list(reference)
    if len(actual) != len(reference):
        raise AssertionError(f"{name}: {len(actual)} steps != reference {len(reference)}")
    worst = 0.0
    for k, (a, r) in enumerate(zip(actual, reference), start=1):
        a, r = torch.as_tensor(a), torch.as_tensor(r)
        if r.dtype != torch.float64:
            raise TypeError(f"{name}: the reference must be float64, got {r.dtype}")
        tol = k * tolerance(dtype, reduction, safety)
        err = relative_error(a, r)
        assert err <= tol, (f"{name}: step {k} relative error {err:.3g} > tolerance "
                            f"{tol:.3g}")
        worst = max(worst, err / tol)
    return worst
