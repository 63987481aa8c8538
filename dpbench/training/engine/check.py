"""The per-run check: the per-example engine against plain autograd, before any release.

The reported epsilon assumes that every example's contribution to the pre-noise sum is
``f_i g_i`` with ``||f_i g_i|| <= C`` and ``g_i`` example i's true gradient (Abadi et al.
2016, Algorithm 1: clip each per-example gradient, then sum). An engine (book-keeping,
Opacus hooks, functorch, ghost clipping) computes ``g_i`` or ``||g_i||`` from per-layer rules
that hold for the layers it knows; this module does not trust them. Once per run (and again
after a resume) it takes the first few training examples and compares, at a tolerance derived
from the model's dtype:

1. each example's gradient norm from the engine with ``||g_i||`` from plain autograd (one
   forward of the few examples, then one ``autograd.grad`` per example's loss);
2. the engine's clipped sum ``sum_i min(1, c / ||g_i||) g_i`` with the same sum of the plain
   autograd gradients, ``c`` half the smallest norm so that every example is clipped and
   each one's direction counts with equal weight;
3. the engine's unclipped sum with one ordinary batched backward of the summed loss (a
   weight used outside its layer or examples folded into another axis change it, even where
   an engine's norms happen to agree).

A method that combines per-example gradients of several evaluation points before clipping
(DiSK, FIBER, IVON with samples; the engine's ``combines_points``) is checked on such a
combination too: ``d_i = w_1 g_i(theta) + w_2 g_i(theta + delta)`` with the fixed weights
``TWO_POINT_WEIGHTS`` and a fixed small ``delta``, its norms, clipped and unclipped sums from the
engine's own multi-point path (book-keeping's cross terms; the materialised gradients of each
point under Opacus) against the same combination of plain-autograd gradients at both points.

Under ``privacy.unit=user`` with user-level sampling (the engine's ``per_user``), the
engine's per-user path (``clipped_user_sum``, ``per_user.py``) is checked too: the check's
examples are given the user ids ``CHECK_USERS`` (one user holding several of them, out of
order, and one holding one), and each user's norm ``||sum_{i in u} g_i||`` and the clipped
sum ``sum_u min(1, c / ||D_u||) D_u`` (c half the smallest user norm) are compared with the
same sums of the plain-autograd gradients. An engine that clips examples before summing, or
groups rows by position instead of by user, fails it.

Which examples: the first rows of the training set whose loss and gradient are finite, so no
sampling or noise stream is drawn.
The global RNG and the task's stream are saved and restored around the check, and every
forward of the check starts from the same state, so dropout masks and per-example draws in the
loss (diffusion timesteps) are the same for the reference and the engine; the run's own draws
are untouched and its results are what they were without the check.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import default_collate

from dpbench.errors import ConfigError
from dpbench.training.checkpoint import rng_state, set_rng_state
from dpbench.utils.tensors import move_to, parameters_at

#: examples whose gradients are checked one at a time
CHECK_EXAMPLES = 4
#: training rows scanned for examples with a finite loss and gradient
SCAN_ROWS = 64
#: the relative tolerance is SAFETY * eps(dtype) (2.4e-4 in float32), at most MAX_TOLERANCE
SAFETY = 2048.0
MAX_TOLERANCE = 0.25
#: a parameter whose reference sum is below this fraction of the whole sum's norm is compared
#: against that floor (an exactly zero reference, e.g. LoRA's A under B = 0, has no scale)
FLOOR = 1e-3
#: the weights (w_1, w_2) of the two-point check; one negative, so a wrong sign of the cross
#: term shows
TWO_POINT_WEIGHTS = (-0.5, 1.5)
#: delta_p = DELTA_SCALE * rms(p) * N(0, 1) per parameter (a fixed draw, seed DELTA_SEED)
DELTA_SCALE = 0.05
DELTA_SEED = 20241
#: the user id of each of the check's examples on the per-user path (module doc)
CHECK_USERS = (7, 3, 7, 7)
LossFn = Callable[[nn.Module, Any], torch.Tensor]


@dataclass(frozen=True)
class CheckPoint:
    """One evaluation point of the two-point check (the interface of ``EvalPoint``)."""

    weight: float = 1.0
    offsets: Sequence[torch.Tensor] | None = None


def check_points(params: Sequence[torch.Tensor]) -> list[CheckPoint]:
    """Return the two points of the two-point check: theta and theta + delta (fixed draw)."""
    gen = torch.Generator().manual_seed(DELTA_SEED)
    offsets = []
    for p in params:
        noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
        rms = float(p.detach().double().pow(2).mean().sqrt()) if p.numel() else 0.0
        offsets.append((DELTA_SCALE * (rms or 1.0) * noise).to(p.device, p.dtype))
    w1, w2 = TWO_POINT_WEIGHTS
    return [CheckPoint(w1), CheckPoint(w2, offsets)]


def check_tolerance(dtype: torch.dtype) -> float:
    """Return the relative tolerance of the check for a model computing in ``dtype``."""
    return min(SAFETY * torch.finfo(dtype).eps, MAX_TOLERANCE)


@dataclass
class EngineCheck:
    """What one per-run check compared and found."""

    engine: str
    examples: int
    tolerance: float
    worst_error: float = 0.0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: what the engine raised on the check's examples (a refusal or a crash), if it did
    error: str | None = None
    #: evaluation points of the path checked: 1, or 2 for a method combining points
    points: int = 1

    @property
    def passed(self) -> bool:
        return not self.failures

    def line(self, numbers: bool = True) -> str:
        """Return the one-line summary of a failed check; ``numbers=False`` leaves out the
        worst error (computed on training rows) for records of a run that goes on."""
        if self.error is not None:
            return f"engine {self.engine} failed on the check's examples ({self.error})"
        worst = (f" (worst relative error {self.worst_error:.3g} > {self.tolerance:.3g})"
                 if numbers else f" (beyond the tolerance {self.tolerance:.3g})")
        return (f"engine {self.engine} disagrees with plain autograd on "
                f"{', '.join(self.failures[:6])}{' ...' if len(self.failures) > 6 else ''}"
                + worst)


class _Streams:
    """Every forward of the check starts from one RNG state; the run's state is restored."""

    def __init__(self, task: Any, generator: torch.Generator | None) -> None:
        self.task, self.generator = task, generator
        self._start: dict[str, Any] | None = None
        self._task_start: torch.Tensor | None = None

    @contextlib.contextmanager
    def fork(self) -> Iterator[_Streams]:
        saved_rng, saved_task = rng_state(), getattr(self.task, "generator", None)
        if self._start is None:  # the first fork fixes the state every forward starts from
            self._start = saved_rng
            self._task_start = (self.generator.get_state() if self.generator is not None
                                else None)
        if self.generator is not None:
            self.task.generator = self.generator
        try:
            yield self
        finally:
            set_rng_state(saved_rng)
            if self.generator is not None:
                self.task.generator = saved_task

    def reset(self) -> None:
        set_rng_state(self._start)
        if self.generator is not None:
            self.generator.set_state(self._task_start)


@contextlib.contextmanager
def _hooks_off(engine: Any) -> Iterator[None]:
    """Turn an Opacus engine's hooks off for the plain-autograd reference."""
    module = getattr(engine, "module", None)
    if hasattr(module, "disable_hooks"):
        module.disable_hooks()
        try:
            yield
        finally:
            module.enable_hooks()
    else:  # book-keeping records only inside its own calls
        yield


def check_rows(dataset: Any, device: torch.device, rows: Sequence[int]) -> Any:
    """Return ``rows`` of ``dataset`` as one batch (default collate, as the loop's loader)."""
    return move_to(default_collate([dataset[i] for i in rows]), device)


def _reference(model: nn.Module, params: Sequence[torch.Tensor], loss_fn: LossFn, batch,
               streams: _Streams, reset: bool = True) -> tuple[
                   torch.Tensor, list[list[torch.Tensor]], list[torch.Tensor]]:
    """Return (kept mask, per-example gradients, summed gradient) by plain autograd.

    ``reset=False`` continues the RNG streams where the previous forward left them (the
    second point of a combination, as the engines' multi-point paths draw)."""
    if reset:
        streams.reset()
    losses = loss_fn(model, batch)
    n = losses.shape[0]
    finite = torch.isfinite(losses.detach()).cpu()
    grads, kept = [], torch.zeros(n, dtype=torch.bool)
    zeros = [torch.zeros_like(p) for p in params]
    for i in range(n):
        if not bool(finite[i]) or not losses.requires_grad:
            grads.append(zeros)
            continue
        g = torch.autograd.grad(losses[i], params, retain_graph=True, allow_unused=True)
        g = [torch.zeros_like(p) if x is None else x.detach() for p, x in zip(params, g)]
        if all(bool(torch.isfinite(x).all()) for x in g):
            grads.append(g)
            kept[i] = True
        else:  # a non-finite gradient: every engine drops the example
            grads.append(zeros)
    if bool(kept.all()) and losses.requires_grad:  # one ordinary backward of the summed loss
        full = torch.autograd.grad(losses.sum(), params, allow_unused=True)
        total = [torch.zeros_like(p) if x is None else x.detach() for p, x in zip(params, full)]
    else:  # 0 * inf would poison a batched backward: the sum of the kept examples
        total = [sum((grads[i][j] for i in range(n) if kept[i]), torch.zeros_like(p))
                 for j, p in enumerate(params)]
    return kept, grads, total


def _engine_sums(engine: Any, loss_fn: LossFn, batch, clip: float, streams: _Streams,
                 points: Sequence[CheckPoint] | None = None) -> tuple[
                     torch.Tensor, torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """Return (norms, kept, clipped sums, unclipped sums) from the engine's protocol call
    (``clipped_sum``, the loop's own), of one point or (``points``) of their combination."""
    def clip_factors(norms: torch.Tensor) -> torch.Tensor:
        return (clip / norms.clamp_min(1e-30)).clamp(max=1.0)

    def sums(factors_fn):
        streams.reset()
        return engine.clipped_sum(loss_fn, batch, points or [CheckPoint()], factors_fn)

    clipped, norms, _, _, kept = sums(clip_factors)
    unclipped = sums(torch.ones_like)[0]
    return norms, kept.cpu(), clipped, unclipped


def _relative(actual: torch.Tensor, reference: torch.Tensor, floor: float) -> float:
    diff = float((actual.detach().double() - reference.double()).norm())
    scale = max(float(reference.double().norm()), floor)
    if scale == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / scale


class EngineVerifier:
    """The per-run check for one model: the plain-autograd reference once, then any engine.

    ``prepare`` computes the reference on the bare model (before an engine's hooks are on
    it: Opacus's backward hooks stay attached to the modules even when disabled);
    ``check(engine)`` runs an engine on the same examples from the same RNG state and
    compares. ``loss_fn(module, batch)`` is the task's per-example loss; ``generator``
    replaces ``task.generator`` during the check (a stream of its own).
    """

    def __init__(self, model: nn.Module, loss_fn: LossFn, dataset: Any, device: torch.device,
                 *, task: Any = None, generator: torch.Generator | None = None,
                 examples: int = CHECK_EXAMPLES) -> None:
        self.model, self.loss_fn, self.dataset, self.device = model, loss_fn, dataset, device
        self.examples = examples
        self.streams = _Streams(task, generator)
        self._reference: tuple | None = None
        self._combined: tuple | None = None  # the two-point reference, when one is checked
        self.reference_seconds = 0.0

    @contextlib.contextmanager
    def _session(self) -> Iterator[None]:
        # each module's own flag: train(mode) is recursive, and a cached prefix sits in eval
        modes = [(m, m.training) for m in self.model.modules()]
        self.model.train()  # the mode fit() trains in
        try:
            with self.streams.fork():
                yield
        finally:
            for m, mode in modes:
                m.training = mode
            for p in self.model.parameters():
                p.grad = None

    def prepare(self, engine: Any = None) -> None:
        """Compute the reference (``engine``: one already hooked to the model, hooks off)."""
        if self._reference is not None:
            return
        start_time = time.perf_counter()
        params = [p for p in self.model.parameters() if p.requires_grad]
        with self._session(), _hooks_off(engine):
            found = self._pick(params)
        if found is None:
            raise ConfigError(f"the per-run engine check found no example with a finite "
                              f"loss and gradient among the first {SCAN_ROWS} training "
                              "examples; check the model and data")
        self._reference = found
        self.reference_seconds = time.perf_counter() - start_time

    def _pick(self, params: list[torch.Tensor]) -> tuple | None:
        """Return (batch, kept, per-example grads, summed grad) of the first ``examples`` rows
        whose loss and gradient are finite (a non-finite row would turn the batched backward
        into 0 * NaN for every row), or None."""
        first = list(range(min(self.examples, len(self.dataset))))
        if not first:
            return None
        batch = check_rows(self.dataset, self.device, first)
        kept, grads, total = _reference(self.model, params, self.loss_fn, batch, self.streams)
        if bool(kept.all()):  # the common case: the first rows, one forward
            return batch, kept, grads, total
        rows: list[int] = []
        for start in range(0, min(SCAN_ROWS, len(self.dataset)), self.examples):
            block = list(range(start, min(start + self.examples, len(self.dataset))))
            self.streams.reset()
            with torch.no_grad():
                losses = self.loss_fn(self.model, check_rows(self.dataset, self.device, block))
            rows += [r for r, ok in zip(block, torch.isfinite(losses).cpu().tolist()) if ok]
            if len(rows) >= self.examples:
                break
        rows = rows[:self.examples]
        while rows:
            batch = check_rows(self.dataset, self.device, rows)
            kept, grads, total = _reference(self.model, params, self.loss_fn, batch,
                                            self.streams)
            if bool(kept.all()):
                return batch, kept, grads, total
            rows = [r for r, ok in zip(rows, kept.tolist()) if ok]
        return None

    def _prepare_combined(self, engine: Any) -> None:
        """Compute the two-point reference: w_1 g_i(theta) + w_2 g_i(theta + delta)."""
        if self._combined is not None:
            return
        start_time = time.perf_counter()
        params = [p for p in self.model.parameters() if p.requires_grad]
        batch = self._reference[0]
        points = check_points(params)
        parts = []
        with self._session(), _hooks_off(engine):
            for k, point in enumerate(points):
                with parameters_at(params, point.offsets):
                    parts.append(_reference(self.model, params, self.loss_fn, batch,
                                            self.streams, reset=k == 0))
        kept = parts[0][0] & parts[1][0]
        (w1, w2), (_, g1, t1), (_, g2, t2) = TWO_POINT_WEIGHTS, parts[0], parts[1]
        grads = [[w1 * a + w2 * b for a, b in zip(r1, r2)] for r1, r2 in zip(g1, g2)]
        total = [w1 * a + w2 * b for a, b in zip(t1, t2)]
        self._combined = (batch, kept, grads, total, points)
        self.reference_seconds += time.perf_counter() - start_time

    def check(self, engine: Any, combined: bool | None = None) -> EngineCheck:
        """Return the comparison of ``engine`` with the reference (``passed`` False: refuse).

        ``combined`` (default: the engine's ``combines_points``) also checks the engine's
        two-point path (the module doc); both must pass.
        """
        combined = getattr(engine, "combines_points", False) if combined is None else combined
        self.prepare(engine)
        if combined:
            self._prepare_combined(engine)
        start_time = time.perf_counter()
        dtype = engine.params[0].dtype if engine.params else torch.float32
        check = EngineCheck(engine=engine.mode, examples=0, tolerance=check_tolerance(dtype),
                            points=2 if combined else 1)
        batch, kept, grads, total = self._reference
        with self._session():
            _compare(check, engine, self.loss_fn, batch, self.streams, list(engine.names),
                     kept, grads, total)
            if combined and check.passed:
                two = EngineCheck(engine=engine.mode, examples=0, tolerance=check.tolerance)
                batch, kept, grads, total, points = self._combined
                _compare(two, engine, self.loss_fn, batch, self.streams,
                         list(engine.names), kept, grads, total, points)
                check.worst_error = max(check.worst_error, two.worst_error)
                check.error = two.error
                check.failures = [f"{f} (two-point combination)" for f in two.failures]
            if getattr(engine, "per_user", False) and check.passed:
                batch, kept, grads, _ = self._reference
                _compare_users(check, engine, self.loss_fn, batch, self.streams,
                               list(engine.names), kept, grads)
        check.seconds = time.perf_counter() - start_time + self.reference_seconds
        self.reference_seconds = 0.0  # counted once, with the first engine checked
        return check


def verify_engine(engine: Any, model: nn.Module, loss_fn: LossFn, dataset: Any,
                  device: torch.device, **kwargs: Any) -> EngineCheck:
    """Return the per-run check of one engine already built on ``model`` (``EngineVerifier``)."""
    return EngineVerifier(model, loss_fn, dataset, device, **kwargs).check(engine)


def _compare(check: EngineCheck, engine: Any, loss_fn: LossFn, batch, streams: _Streams,
             names: list[str], kept_ref: torch.Tensor, grads: list[list[torch.Tensor]],
             total: list[torch.Tensor], points: Sequence[CheckPoint] | None = None) -> None:
    """Fill ``check`` with the engine's errors against the reference (see the module doc)."""
    n = len(kept_ref)
    check.examples = int(kept_ref.sum())
    ref_norms = torch.stack([torch.linalg.vector_norm(torch.stack(
        [torch.linalg.vector_norm(x.double()) for x in g])) for g in grads]).cpu()  # kept_ref's
    clip = 0.5 * float(ref_norms[kept_ref].min())
    clip = clip if clip > 0 else 1.0
    factors = torch.where(kept_ref, (clip / ref_norms.clamp_min(1e-300)).clamp(max=1.0),
                          torch.zeros_like(ref_norms))
    ref_clipped = [sum((float(factors[i]) * grads[i][j].double() for i in range(n)),
                       torch.zeros_like(t, dtype=torch.float64)) for j, t in enumerate(total)]
    try:
        norms, kept, clipped, unclipped = _engine_sums(engine, loss_fn, batch, clip, streams,
                                                       points)
    except Exception as err:  # noqa: BLE001 - a refusal or crash of the engine, not the model
        message = str(err).strip().splitlines()[0] if str(err).strip() else ""
        check.error = f"{type(err).__name__}: {message}"
        check.failures.append("the check's examples")
        check.worst_error = math.inf
        return
    errors: dict[str, float] = {}
    if norms.shape[:1] != (n,) or not torch.equal(kept, kept_ref):
        check.failures.append(f"the examples kept ({norms.shape[0]} norms for {n} examples)")
        check.worst_error = math.inf
        return
    scale = float(ref_norms[kept_ref].max())
    for i in range(n):
        if kept_ref[i]:
            errors[f"the norm of example {i}"] = abs(float(norms[i]) - float(ref_norms[i])) / max(
                float(ref_norms[i]), FLOOR * scale)
    # a sum's rounding error scales with the sum of its terms' norms, not with its own norm
    # (4 normalised gradients may nearly cancel): each parameter's error is relative to
    # sum_i w_i ||g_i,p||, which still makes an error of x in every g_i a relative error of x
    term_norms = torch.tensor([[float(torch.linalg.vector_norm(x.double())) for x in g]
                               for g in grads], dtype=torch.float64)  # [n, params]
    for label, got, ref, weights in (("clipped sum", clipped, ref_clipped, factors),
                                     ("sum", unclipped, total, kept_ref.double())):
        scales = (weights.unsqueeze(1) * term_norms).sum(0) if n else torch.zeros(0)
        whole = float(scales.sum()) if len(scales) else 0.0
        for j, (name, a, r) in enumerate(zip(names, got, ref)):
            errors[f"{name} ({label})"] = _relative(a, r, max(float(scales[j]), FLOOR * whole))
    check.worst_error = max(errors.values(), default=0.0)
    bad = [k for k, v in errors.items() if not v <= check.tolerance]
    # name each parameter once, the clipped sum first
    seen: list[str] = []
    for k in bad:
        base = k.split(" (")[0]
        if base not in seen:
            seen.append(base)
    check.failures = seen


def _compare_users(check: EngineCheck, engine: Any, loss_fn: LossFn, batch, streams: _Streams,
                   names: list[str], kept_ref: torch.Tensor,
                   grads: list[list[torch.Tensor]]) -> None:
    """Add to ``check`` the engine's per-user norms and clipped sum against the per-user sums
    of the plain-autograd gradients (the module doc; users ``CHECK_USERS``)."""
    n = len(kept_ref)
    users = torch.tensor([CHECK_USERS[i % len(CHECK_USERS)] for i in range(n)])
    ids = torch.unique(users, sorted=True)
    ref_users = [[sum((grads[i][j].double() for i in range(n)
                       if kept_ref[i] and users[i] == u), torch.zeros_like(grads[0][j],
                                                                         dtype=torch.float64))
                  for j in range(len(names))] for u in ids.tolist()]
    ref_norms = torch.stack([torch.linalg.vector_norm(torch.stack(
        [torch.linalg.vector_norm(x) for x in g])) for g in ref_users])
    clip = 0.5 * float(ref_norms.min()) or 1.0
    factors = (clip / ref_norms.clamp_min(1e-300)).clamp(max=1.0)
    ref_sum = [sum((float(factors[u]) * ref_users[u][j] for u in range(len(ids))),
                   torch.zeros_like(ref_users[0][j])) for j in range(len(names))]

    def clip_factors(norms: torch.Tensor) -> torch.Tensor:
        return (clip / norms.clamp_min(1e-30)).clamp(max=1.0)

    streams.reset()
    try:
        got = engine.clipped_user_sum(loss_fn, batch, users.to(check_device(batch)),
                                      [CheckPoint()], clip_factors)
    except Exception as err:  # noqa: BLE001 - a refusal or crash of the engine
        message = str(err).strip().splitlines()[0] if str(err).strip() else ""
        check.error = f"{type(err).__name__}: {message} (per-user sums)"
        check.failures.append("the per-user sums")
        check.worst_error = math.inf
        return
    if got.norms.shape[:1] != (len(ids),):
        check.failures.append(f"the users ({got.norms.shape[0]} norms for {len(ids)} users)")
        check.worst_error = math.inf
        return
    errors = {f"the norm of user {u}": abs(float(got.norms[k]) - float(ref_norms[k]))
              / max(float(ref_norms[k]), 1e-300) for k, u in enumerate(ids.tolist())}
    whole = float(sum(float(factors[u]) * float(ref_norms[u]) for u in range(len(ids))))
    for name, a, r in zip(names, got.sums, ref_sum):
        errors[f"{name} (per-user clipped sum)"] = _relative(a, r, max(FLOOR * whole, 1e-300))
    check.worst_error = max(check.worst_error, *errors.values())
    check.failures += [k for k, v in errors.items() if not v <= check.tolerance]


def check_device(batch: Any) -> torch.device:
    """Return the device of the first tensor in ``batch``."""
    if isinstance(batch, torch.Tensor):
        return batch.device
    if isinstance(batch, dict):
        return check_device(next(iter(batch.values())))
    return check_device(batch[0])


def record_check(records: list[dict[str, Any]], check: EngineCheck, when: str,
                 step: int) -> None:
    """Append ``check`` to a run's check records; refuse the run if it failed."""
    if not check.passed:
        raise ConfigError(f"the per-run engine check failed ({when}), refusing to release: "
                          f"{check.line()}")
    records.append({"when": when, "step": step, "engine": check.engine,
                    "examples": check.examples, "tolerance": check.tolerance,
                    "worst_error": check.worst_error, "seconds": round(check.seconds, 4)})
