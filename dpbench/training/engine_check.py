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
from dpbench.training.per_example import flat_norms
from dpbench.utils.tensors import move_to

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
LossFn = Callable[[nn.Module, Any], torch.Tensor]


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
               streams: _Streams) -> tuple[torch.Tensor, list[list[torch.Tensor]],
                                           list[torch.Tensor]]:
    """Return (kept mask, per-example gradients, summed gradient) by plain autograd."""
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


def _engine_sums(engine: Any, loss_fn: LossFn, batch, clip: float,
                 streams: _Streams) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor],
                                             list[torch.Tensor]]:
    """Return (norms, kept, clipped sums, unclipped sums) as the engine computes them."""
    def clip_factors(norms: torch.Tensor) -> torch.Tensor:
        return (clip / norms.clamp_min(1e-30)).clamp(max=1.0)

    if engine.mode in ("bk", "ghost"):
        streams.reset()
        clipped, norms, _, _, kept = engine.ghost_clipped_sum(loss_fn, batch, clip_factors)
        streams.reset()
        unclipped, _, _, _, _ = engine.ghost_clipped_sum(loss_fn, batch, torch.ones_like)
        return norms, kept.cpu(), clipped, unclipped
    streams.reset()
    grads, losses = engine.per_example(loss_fn, batch)
    norms = flat_norms(grads)
    kept = (torch.isfinite(norms) & torch.isfinite(losses)).cpu()
    mask = kept.to(norms.device)
    norms = torch.where(mask, norms, torch.zeros_like(norms))
    factors = torch.where(mask, clip_factors(norms), torch.zeros_like(norms))
    clipped = [torch.einsum("i,i...->...", factors.to(g.dtype), torch.where(
        mask.view(-1, *[1] * (g.dim() - 1)), g, torch.zeros_like(g))) for g in grads]
    unclipped = [torch.einsum("i,i...->...", mask.to(g.dtype), torch.where(
        mask.view(-1, *[1] * (g.dim() - 1)), g, torch.zeros_like(g))) for g in grads]
    return norms, kept, clipped, unclipped


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

    def check(self, engine: Any) -> EngineCheck:
        """Return the comparison of ``engine`` with the reference (``passed`` False: refuse)."""
        self.prepare(engine)
        start_time = time.perf_counter()
        dtype = engine.params[0].dtype if engine.params else torch.float32
        check = EngineCheck(engine=engine.mode, examples=0, tolerance=check_tolerance(dtype))
        batch, kept, grads, total = self._reference
        with self._session():
            _compare(check, engine, self.loss_fn, batch, self.streams, list(engine.names),
                     kept, grads, total)
        check.seconds = time.perf_counter() - start_time + self.reference_seconds
        self.reference_seconds = 0.0  # counted once, with the first engine checked
        return check


def verify_engine(engine: Any, model: nn.Module, loss_fn: LossFn, dataset: Any,
                  device: torch.device, **kwargs: Any) -> EngineCheck:
    """Return the per-run check of one engine already built on ``model`` (``EngineVerifier``)."""
    return EngineVerifier(model, loss_fn, dataset, device, **kwargs).check(engine)


def _compare(check: EngineCheck, engine: Any, loss_fn: LossFn, batch, streams: _Streams,
             names: list[str], kept_ref: torch.Tensor, grads: list[list[torch.Tensor]],
             total: list[torch.Tensor]) -> None:
    """Fill ``check`` with the engine's errors against the reference (see the module doc)."""
    n = len(kept_ref)
    check.examples = int(kept_ref.sum())
    ref_norms = torch.stack([torch.linalg.vector_norm(torch.stack(
        [torch.linalg.vector_norm(x.double()) for x in g])) for g in grads])
    clip = 0.5 * float(ref_norms[kept_ref].min())
    clip = clip if clip > 0 else 1.0
    factors = torch.where(kept_ref, (clip / ref_norms.clamp_min(1e-300)).clamp(max=1.0),
                          torch.zeros_like(ref_norms))
    ref_clipped = [sum((float(factors[i]) * grads[i][j].double() for i in range(n)),
                       torch.zeros_like(t, dtype=torch.float64)) for j, t in enumerate(total)]
    try:
        norms, kept, clipped, unclipped = _engine_sums(engine, loss_fn, batch, clip, streams)
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
