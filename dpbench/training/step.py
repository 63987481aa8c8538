"""One step: the engine's clipped sums, the extra queries and the Gaussian release (stages
3-6), then a release's post-processing, the update and the mechanism's advance (stages 7-10).

``clipped_aggregate`` and ``private_release`` are, with the accountant, the only code of a
private step that touches raw data or noise. Methods supply evaluation points, clip factors
and extra queries; the release is always ``g = (sum_i w_i u_i + N(0, (sigma_g S)^2 I)) / B``
with S the method's sensitivity and B the *expected* batch size (docs/privacy.md).
``apply_release`` reads released (noisy) values only, so it cannot change epsilon
(docs/adding-a-method.md). A non-private run's exact gradient and a step's un-privatised
diagnostics are in ``nonprivate.py``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from dpbench.errors import PrivacyError, TrainingDiverged
from dpbench.methods.base import (
    EvalPoint,
    ExtraQuery,
    Halves,
    Mechanism,
    NoiseShaper,
    Released,
    StepContext,
    Update,
    gradient_queries,
)
from dpbench.privacy.ledger import Query
from dpbench.privacy.plan import StepPlan
from dpbench.tasks.base import Task
from dpbench.training.batches import batch_size, physical_chunks, slice_batch
from dpbench.training.distributed import Collective
from dpbench.training.engine.protocol import Engine

SENSITIVITY_SLACK = 1e-4  # relative slack for float round-off in the sensitivity check
ONE_PROCESS = Collective()  # the default: a 1-process run (its calls are no-ops)


@dataclass
class Release:
    """What one step released, plus diagnostics that are *not* privatised."""

    grads: list[torch.Tensor]
    queries: list[Query]
    noisy_extras: dict[str, torch.Tensor] = field(default_factory=dict)
    #: the mechanism's evaluation points of the step (public: drawn from the method's stream)
    points: tuple[EvalPoint, ...] = ()
    realised_batch: int = 0
    # diagnostics of the examples kept (finite loss and gradient), computed on private data
    losses: torch.Tensor | None = None  # diagnostic only
    norms: torch.Tensor | None = None  # diagnostic only
    clipped_fraction: float = 0.0  # diagnostic only


def _check_bound(name: str, contributions: torch.Tensor, bound: float,
                 unit: str = "example") -> None:
    if contributions.numel() and float(contributions.max()) > bound * (1 + SENSITIVITY_SLACK):
        raise PrivacyError(
            f"{name}: one {unit} contributes {float(contributions.max()):.6g} but the "
            f"accountant assumes a sensitivity of {bound:.6g}; refusing to release")


@dataclass
class Aggregate:
    """The pre-noise sums of one logical step (what the Gaussian noise is added to).

    ``losses``, ``norms`` and ``factors`` list the examples kept: an example whose loss or
    gradient is not finite is dropped (it contributes 0 to every sum and query).
    """

    sums: list[torch.Tensor]
    extra_sums: dict[str, torch.Tensor]
    extra_specs: dict[str, ExtraQuery]
    queries: list[Query]
    realised_batch: int
    losses: torch.Tensor
    norms: torch.Tensor
    factors: torch.Tensor
    points: tuple[EvalPoint, ...] = ()


def plan_at(mechanism: Mechanism, sigma: float, expected_batch_size: float) -> StepPlan:
    """Return the Poisson step plan of ``mechanism`` at noise multiplier ``sigma`` and expected
    batch size B (for a step outside a run: the benchmark, tests; the loop builds its own)."""
    return StepPlan(sigma > 0, "poisson", 0.0, float(expected_batch_size), sigma,
                    mechanism.gradient_noise_multiplier(sigma) if sigma > 0 else 0.0)


def clipped_aggregate(mechanism: Mechanism, engine: Engine, task: Task, batch,
                      ctx: StepContext, plan: StepPlan, max_physical: int | None,
                      users: torch.Tensor | None = None) -> Aggregate:
    """Return sum_i w_i u_i and the extra queries' sums, checked against their sensitivity.

    Stages 3-5 and the pre-noise half of stage 6; ``private_release`` adds the noise. Tests
    call this on neighbouring batches to check the sensitivity the accountant assumes. The
    check cannot be turned off: a release whose contributions exceed it is refused.

    ``users`` (privacy.unit=user, user-level sampling): each row's user id; the unit clipped
    is then the user (``engine.clipped_user_sum``: each user's gradient sum before its norm,
    ``engine/per_user.py``), the norms, factors and extra queries are per user, and the
    physical chunks never split a user (``user_chunks``).
    """
    params = engine.params
    points = tuple(mechanism.evaluation_points(ctx))
    sensitivity = mechanism.sensitivity(ctx)
    sums: list[torch.Tensor] | None = None  # the first chunk's sums (fresh tensors) start it
    extra_sums: dict[str, torch.Tensor] = {}
    extra_specs: dict[str, ExtraQuery] = {}
    losses, norms_all, factors_all = [], [], []
    n = batch_size(batch)
    if users is not None:
        chunks = user_chunks(batch, users, max_physical) if n > 0 else []
    else:
        chunks = ((c, None) for c in physical_chunks(batch, max_physical)) if n > 0 else []
    unit = "example" if users is None else "user"
    observe = None
    if task.observes_gradients and users is None:  # diagnostics (off by default)
        def observe(rows: dict[str, torch.Tensor], norms: torch.Tensor) -> None:
            task.observe_per_example_gradients(rows, norms, ctx.clip_norm)
    for chunk, chunk_users in chunks:  # stages 3-5: the engine's protocol call (protocol.py)
        if chunk_users is None:
            chunk_sums, norms, factors, loss, kept = engine.clipped_sum(
                task.per_example_loss, chunk, points,
                lambda nr: mechanism.clip_factors(nr, ctx), observe)
        else:
            chunk_sums, norms, factors, loss, kept = engine.clipped_user_sum(
                task.per_example_loss, chunk, chunk_users, points,
                lambda nr: mechanism.clip_factors(nr, ctx))
        _check_bound("gradient", factors * norms, sensitivity, unit)
        if sums is None:
            sums = list(chunk_sums)
        else:
            for s, c in zip(sums, chunk_sums):
                s.add_(c)
        every = bool(kept.all())  # the common case: no boolean indexing
        kept_norms = norms if every else norms[kept.to(norms.device)]
        for q in mechanism.extra_queries(kept_norms, ctx):  # dropped examples make no query
            _check_bound(q.name, q.values.abs(), q.sensitivity, unit)
            extra_sums[q.name] = extra_sums.get(q.name, 0.0) + q.values.sum()
            extra_specs[q.name] = q
        losses.append(_detached(loss))
        norms_all.append(_detached(kept_norms))
        factors_all.append(_detached(factors if every else factors[kept.to(factors.device)]))
    if sums is None:  # an empty batch: zero sums (the noise is still added)
        sums = [torch.zeros_like(p) for p in params]
    if n == 0:  # an empty batch still releases every query the method makes
        extra_specs = {q.name: q for q in mechanism.extra_queries(
            torch.zeros(0, device=sums[0].device), ctx)}
    queries = gradient_queries(mechanism, ctx, plan, list(extra_specs.values()))
    return Aggregate(
        sums=sums, extra_sums=extra_sums, extra_specs=extra_specs, queries=queries,
        realised_batch=n, losses=_joined(losses), norms=_joined(norms_all),
        factors=_joined(factors_all), points=points)


def user_chunks(batch: Any, users: torch.Tensor, max_size: int | None):
    """Yield (rows, their user ids) in pieces of at most ``max_size`` rows that never split a
    user (a user's rows are contiguous in a user-level batch; a user with more rows than
    ``max_size`` is one piece of its own).

    The ULS loader places a user's rows next to each other; that is checked, not assumed: a
    user whose rows are split would be clipped once per piece (up to 2C), so a batch whose
    user ids are not contiguous runs is refused in one line before any engine call.
    """
    n = batch_size(batch)
    cut = users.cpu()
    change = (cut[1:] != cut[:-1]).nonzero().flatten().add(1).tolist()
    if len(change) + 1 != len(torch.unique(cut)) and n > 0:
        raise PrivacyError("privacy.unit=user: a batch's rows of one user are not contiguous "
                           "(the user-level loader must place each user's rows together); "
                           "refusing to release")
    if not max_size or n <= max_size:
        yield batch, users
        return
    bounds = [0, *change, n]
    start = 0
    for a, b in zip(bounds, bounds[1:]):
        if b - start > max_size and a > start:
            yield slice_batch(batch, start, a), users[start:a]
            start = a
    yield slice_batch(batch, start, n), users[start:n]


def _detached(x: torch.Tensor) -> torch.Tensor:
    """Return ``x`` out of the graph (itself when it is already: no new tensor per step)."""
    return x.detach() if x.requires_grad else x


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """Return the chunks' values as one tensor (no copy for a single chunk)."""
    if not parts:
        return torch.zeros(0)
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def private_release(mechanism: Mechanism, engine: Engine, task: Task, batch,
                    ctx: StepContext, plan: StepPlan, max_physical: int | None,
                    noise_shaper: NoiseShaper | None = None, *,
                    noise: torch.Generator | None = None,
                    collective: Collective | None = None,
                    users: torch.Tensor | None = None) -> Release:
    """Return the noisy mean gradient and extra queries of one logical step.

    ``noise`` is the run's noise stream: the release is the only code given it (the
    mechanism's hooks see the ``StepContext``, which holds no generator); ``plan`` the run's
    step plan
    (``privacy.plan.StepPlan``: the gradient query's noise std).

    ``noise_shaper`` (the method's, e.g. BandMF's C^{-1} recursion) maps the step's i.i.d.
    gradient noise to the noise released; None releases it as drawn (DP-SGD).

    ``collective`` (a K-process run, distributed.py): ``batch`` is this rank's slice of the
    global Poisson batch; the pre-noise sums are summed over the ranks, rank 0 alone draws
    and adds the noise, and every rank receives rank 0's release.
    """
    collective = collective or ONE_PROCESS
    agg = clipped_aggregate(mechanism, engine, task, batch, ctx, plan, max_physical, users)
    sums, extra_sums, extra_specs, queries = agg.sums, agg.extra_sums, agg.extra_specs, agg.queries
    device = sums[0].device
    noisy_extras = {name: torch.as_tensor(extra_sums.get(name, 0.0), device=device,
                                          dtype=torch.float32).clone() for name in extra_specs}
    shared = sorted(noisy_extras)  # the same order on every rank
    collective.sum_([*sums, *(noisy_extras[k] for k in shared)])  # over the slices, pre-noise
    released: list[torch.Tensor] = sums
    if collective.is_main:  # the noise is added once per step, from the run's noise stream
        grad_std = queries[0].noise_std
        noises = [torch.normal(0.0, grad_std, size=s.shape, device=s.device,
                               generator=noise) for s in sums]
        if noise_shaper is not None:
            noises = noise_shaper(noises)
            released = [(s + z).div_(plan.expected_batch_size) for s, z in zip(sums, noises)]
        else:  # the fresh draw takes the sum in place (z + s is s + z exactly) unless the
            # sum's dtype is wider (a float64 model: s + z promotes the float32 draw)
            released = [(z.add_(s) if z.dtype == s.dtype else s + z).div_(
                plan.expected_batch_size) for s, z in zip(sums, noises)]
        for name, value in noisy_extras.items():
            z = torch.normal(0.0, extra_specs[name].noise_std, size=(),
                             device=value.device, generator=noise)
            noisy_extras[name] = value + z
    collective.from_main_([*released, *(noisy_extras[k] for k in shared)])  # rank 0's release
    # the diagnostics of every rank's kept examples (not privatised, as in one process)
    norms, factors = collective.cat(agg.norms, device), collective.cat(agg.factors, device)
    return Release(
        grads=released, queries=queries, noisy_extras=noisy_extras, points=agg.points,
        realised_batch=collective.count(agg.realised_batch, device),
        losses=collective.cat(agg.losses, device), norms=norms,
        # clipped = scaled down to the sensitivity bound (right for flat and normalised
        # clipping alike; AUTO-S never reaches the bound)
        clipped_fraction=float((factors * norms >= queries[0].sensitivity
                                * (1 - 1e-4)).float().mean()) if norms.numel() else 0.0,
    )


# ---- stages 7-10: post-processing, update, advance (released values only) ---------------

def all_finite(*groups: Iterable[torch.Tensor]) -> bool:
    """Return whether every tensor in ``groups`` (iterables of tensors) is finite.

    One check for all of them: the largest |x| over every floating tensor (torch's
    ``get_total_norm`` of order inf) is finite exactly when each entry is, since a maximum
    propagates NaN and cannot overflow; one device sync instead of one per tensor.
    """
    tensors = [t for group in groups for t in group
               if t.numel() and (t.is_floating_point() or t.is_complex())]
    if not tensors:
        return True
    return bool(torch.isfinite(torch.nn.utils.get_total_norm(tensors, math.inf)))


def apply_release(halves: Halves, params: Sequence[torch.nn.Parameter], release: Release,
                  ctx: StepContext, skip: bool, epoch: int = 0) -> bool:
    """Post-process and apply ``release``; return False if it was not finite and skipped.

    The update's hooks (stages 7-9) are handed the step context, with the step's evaluation
    points (``ctx.points``), and the released values; the mechanism's ``advance`` (stage 10)
    a ``Released``. With ``skip`` the parameters and both halves' state are restored to what
    they were before a step that was not finite; without it the run stops
    (``TrainingDiverged``).
    """
    mechanism, update = halves.mechanism, halves.update
    saved = _snapshot(halves, params) if skip else None
    ctx.points = release.points
    ok = all_finite(release.grads, release.noisy_extras.values())
    if ok:  # stages 7-9
        grads = update.postprocess(release.grads, ctx)
        # the default post-processing returns the release as it is: checked above
        ok = (getattr(update.postprocess, "__func__", None) is Update.postprocess
              or all_finite(grads))
        if ok:
            update.update(grads, ctx)
            update.after_step(release.noisy_extras, ctx)
            public = MappingProxyType(update.public_state())
    if ok:
        # the mechanism's moving parameters: from the released values and the update's
        # public state only (the hook's argument holds nothing else)
        mechanism.advance(Released(step=ctx.step, extras=MappingProxyType(release.noisy_extras),
                                   grads=tuple(release.grads), public=public))
        ok = all_finite(params)
    if not ok and not skip:
        raise TrainingDiverged(
            f"non-finite released gradient or update at step {ctx.step} (epoch {epoch}); the "
            "last good checkpoint is kept. Lower the learning rate, or set "
            "trainer.nonfinite=skip to skip such updates (they stay accounted)")
    if not ok:
        _restore(halves, params, saved)
    return ok


def _snapshot(halves: Halves, params: Sequence[torch.nn.Parameter]) -> dict[str, Any]:
    return {"params": [p.detach().clone() for p in params],
            "method": copy.deepcopy(halves.state_dict())}


def _restore(halves: Halves, params: Sequence[torch.nn.Parameter],
             saved: dict[str, Any]) -> None:
    with torch.no_grad():
        for p, v in zip(params, saved["params"]):
            p.copy_(v)
    halves.load_state_dict(saved["method"])
