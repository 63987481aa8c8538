"""Many seeds of one cell in one process (``trainer.seeds_at_once=K``): K runs in lockstep.

Each seed is a whole ``Trainer`` of its own, built exactly as a separate run of that seed
(its model initialised from its ``model_init`` stream, its own Poisson sampler stream and
batch, its own noise stream, ledger, accountant, checkpoint and record); the group shares
one computation only, the per-example gradients of a step, vectorised over the seeds:

    g_{k,i} = grad_theta loss(theta_k; x_{k,i})   for every seed k and every example i of
    seed k's own Poisson batch,

computed for every seed at once in one of two ways. A ``Sequential`` of flatten, linear and
element-wise layers (logreg, the MLP) takes a closed form (``LinearRows``): one batched
forward of all seeds and one backward to the layers' outputs; example i's norm and the
clipped sum come from its layer inputs and output gradients, no per-example gradient held.
Any other model (cnn2) takes ``vmap`` over the seeds of ``vmap`` over the examples of
``grad`` of the task's per-example loss at the seeds' stacked parameters
(``torch.func.functional_call``; Opacus's functorch path computes the same per-example
gradients for one model), clipped and summed by ``clip_materialised``. Each seed's batch is
padded to the largest batch of the step and the padded rows are cut off (masked) before
anything reads them: a seed's clipped sum is formed from its own rows only, with its own
clip factors (Abadi et al. 2016, Algorithm 1: clip, then sum), and the noise, the
accounting and the update are the seed's own ``Trainer.train_step``
(``step.private_release``, ``privacy.plan.account_release``, ``step.apply_release``),
unchanged. Each seed's batches come from its own sampler stream (``epoch_batches``).

The group's engine (``MemberEngine``, mode ``seed_group``) replaces the engine each seed's Trainer
chose only after the per-run check (``engine/check.py``) has passed on it for that seed
(``Trainer.use_engine``), and again after a resume, as for any engine. A step's gradients
are handed to a seed only for the very batch its sampler drew (compared value by value);
any other call (the check's rows, a physical chunk) computes that seed's rows alone through
the same stacked computation.

Supported: the models in ``GROUPABLE_MODELS``, the methods in ``GROUPABLE_METHODS``,
classification, Poisson sampling, ``32-true`` precision, one process; anything else is
refused in one line naming what (``grouping_refusal``). docs/engine.md, "Many seeds at
once".
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from torch import nn
from torch.func import functional_call, grad, vmap

from dpbench.errors import ConfigError
from dpbench.training.batches import batch_size, tensor_rows
from dpbench.training.engine.materialised import clip_materialised
from dpbench.training.engine.protocol import (
    ClippedSum,
    FactorsFn,
    LossFn,
    Observer,
    Point,
    kept_examples,
    trainable,
    zero_rows,
)
from dpbench.utils.tensors import map_tensors, move_to, tensors_in

#: model names (``model.name``) whose seeds are trained together: small models, where a
#: step's cost is mostly per-call overhead that the vectorised step shares
GROUPABLE_MODELS = frozenset({"logreg", "mlp", "cnn2"})
#: methods whose whole private step is the materialised clipped sum of one point
GROUPABLE_METHODS = frozenset({"dpsgd"})
GROUPABLE_TASKS = frozenset({"classification"})


def grouping_refusal(*, method: str, model: str, task: str, private: bool, sampler: str,
                     precision: str, grad_sample_mode: str, distributed: bool,
                     unit: str = "example") -> str | None:
    """Return the one-line reason ``trainer.seeds_at_once > 1`` cannot group this cell, or
    None (checked per seed, before anything is built)."""
    if model not in GROUPABLE_MODELS:
        return (f"trainer.seeds_at_once groups the seeds of small models only "
                f"({', '.join(sorted(GROUPABLE_MODELS))}), not model={model}")
    if method not in GROUPABLE_METHODS:
        return (f"trainer.seeds_at_once supports method={', '.join(sorted(GROUPABLE_METHODS))}"
                f", not method={method}")
    if not private:
        return "trainer.seeds_at_once groups private runs only (privacy is off)"
    if task not in GROUPABLE_TASKS:
        return f"trainer.seeds_at_once supports classification, not a {task} task"
    if sampler != "poisson":
        return f"trainer.seeds_at_once supports trainer.sampler=poisson, not {sampler}"
    if precision != "32-true":
        return f"trainer.seeds_at_once supports trainer.precision=32-true, not {precision}"
    if grad_sample_mode != "auto":
        return ("trainer.seeds_at_once uses its own vectorised engine (checked per seed): "
                f"leave trainer.grad_sample_mode=auto (got {grad_sample_mode})")
    if distributed:
        return "trainer.seeds_at_once runs in one process, not under torchrun"
    if unit != "example":
        return ("trainer.seeds_at_once groups example-level runs only (per-user clipping is "
                f"not vectorised over seeds), not privacy.unit={unit}")
    return None


def spec_refusal(spec: Any) -> str | None:
    """Return ``grouping_refusal`` of a checked run (``spec.RunSpec``), one process."""
    cfg = spec.cfg
    return grouping_refusal(
        method=spec.method_name, model=str(cfg.model.name),
        task=str(cfg.dataset.get("task") or "classification"),
        private=bool(spec.privacy.enabled), sampler=spec.trainer.sampler,
        precision=spec.trainer.precision, grad_sample_mode=spec.trainer.grad_sample_mode,
        distributed=False, unit=spec.privacy.unit)


def same_batch(a: Any, b: Any) -> bool:
    """Return whether two batches hold the same tensors, value by value."""
    la, lb = tensors_in(a), tensors_in(b)
    return len(la) == len(lb) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y.to(x.device))
        for x, y in zip(la, lb))


def _padded(batch: Any, rows: int) -> Any:
    """Return ``batch`` with zero rows appended up to ``rows`` (the rows are cut off later)."""
    def pad(t: torch.Tensor) -> torch.Tensor:
        missing = rows - t.shape[0]
        if missing <= 0:
            return t
        return torch.cat([t, t.new_zeros((missing, *t.shape[1:]))])
    return map_tensors(pad, batch)


class _At:
    """The model called at given parameters (``functional_call``): what a task's loss calls."""

    def __init__(self, model: nn.Module, params: dict[str, torch.Tensor]) -> None:
        self.model, self.params = model, params

    def __call__(self, *args: Any) -> torch.Tensor:
        return functional_call(self.model, self.params, args)


#: element-wise modules a linear-path model may hold between its linear layers
ELEMENTWISE = (nn.Tanh, nn.ReLU, nn.Sigmoid, nn.Identity, nn.GELU)


def linear_layers(model: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """Return (name, module) of a ``Sequential`` of flatten, linear and element-wise layers
    (logreg, the MLP), whose per-example gradients have the closed form of ``LinearRows``;
    None for any other model (it takes the ``vmap`` path)."""
    if not isinstance(model, nn.Sequential):
        return None
    layers = list(model.named_children())
    if not layers or not all(isinstance(m, (nn.Linear, nn.Flatten, *ELEMENTWISE))
                             for _, m in layers):
        return None
    if not isinstance(layers[0][1], nn.Flatten):
        return None
    return layers


@dataclass
class LinearRows:
    """One seed's rows of a linear-path step: per linear layer its inputs ``a`` [n, in] and
    output gradients ``g`` [n, out], and the per-example losses.

    Example i's gradient of layer l is the outer product ``g_i a_i^T`` (and ``g_i`` for the
    bias), so ``||G_i||^2 = sum_l ||g_i^l||^2 (||a_i^l||^2 + 1)`` (the ghost norm of
    Goodfellow 2015 and Li et al. 2022 for a layer without a sequence axis) and the clipped
    sum is ``sum_i f_i g_i a_i^T = (f g)^T a``: Abadi et al. 2016, Algorithm 1, without a
    per-example gradient in memory.
    """

    io: list[tuple[torch.Tensor, torch.Tensor]]
    losses: torch.Tensor

    def norms(self, has_bias: list[bool]) -> torch.Tensor:
        total = self.losses.new_zeros(len(self.losses))
        for (a, g), bias in zip(self.io, has_bias):
            gg = g.pow(2).sum(1)
            total = total + gg * (a.pow(2).sum(1) + (1.0 if bias else 0.0))
        return total.sqrt()

    def sums(self, factors: torch.Tensor, has_bias: list[bool]) -> list[torch.Tensor]:
        out = []
        for (a, g), bias in zip(self.io, has_bias):
            fg = g * factors.to(g.dtype).unsqueeze(1)
            out.append(fg.t() @ a)
            if bias:
                out.append(fg.sum(0))
        return out


class SeedGroup:
    """The per-example gradients of K seeds' own batches in one vectorised call.

    ``models``: the K seeds' models (one architecture; each trains its own parameters in
    place, read afresh at every call). ``stage(batches)`` hands the group one step's K
    batches (seed k's drawn by seed k's sampler); the first seed's engine call computes all
    K, each seed then takes its own rows once.
    """

    def __init__(self, models: Sequence[nn.Module]) -> None:
        if not models:
            raise ConfigError("a seed group needs at least one run")
        self.base = models[0]
        self.params: list[list[nn.Parameter]] = []
        names = None
        for model in models:
            params, model_names = trainable(model)
            shapes = [p.shape for p in params]
            if names is None:
                names, first_shapes = model_names, shapes
            elif model_names != names or shapes != first_shapes:
                raise ConfigError("the seeds of a group must share one architecture "
                                  "(their models' parameters differ)")
            self.params.append(params)
        self.names: list[str] = names or []
        self.layers = linear_layers(self.base)
        self._staged: list[Any] | None = None
        # per kind of rows ("examples": per-example gradients; "linear": LinearRows): this
        # step's rows of each seed, and the seeds that have not taken theirs yet
        self._results: dict[str, dict[int, Any]] = {}
        self._pending: dict[str, set[int]] = {}

    @property
    def size(self) -> int:
        return len(self.params)

    def member(self, k: int) -> MemberEngine:
        """Return seed ``k``'s engine (the protocol of ``engine/protocol.py``)."""
        return MemberEngine(self, k)

    def stage(self, batches: Sequence[Any], device: torch.device) -> None:
        """Hand the group one step's batches, seed k's at position k (None: seed k takes
        no step now)."""
        if len(batches) != self.size:
            raise ValueError(f"{len(batches)} batches for a group of {self.size} seeds")
        self._staged = [None if b is None else move_to(b, device) for b in batches]
        self._results = {}
        self._pending = {kind: set(range(self.size)) for kind in ("examples", "linear")}

    def unstage(self) -> None:
        self._staged, self._results, self._pending = None, {}, {}

    def _rows(self, kind: str, k: int, batch: Any,
              compute: Callable[[Sequence[Any]], list[Any]]) -> Any:
        """Return seed ``k``'s rows of ``kind`` on ``batch``: for the step's staged batch,
        computed for every seed at once by the step's first call and handed out once per
        seed; for any other batch (the check's rows, a physical chunk), computed alone."""
        staged, pending = self._staged, self._pending.get(kind, ())
        if staged is not None and k in pending and same_batch(batch, staged[k]):
            if kind not in self._results:  # the step's first call: every seed's own batch
                self._results[kind] = dict(enumerate(compute(staged)))
            pending.discard(k)  # each seed takes its rows of a step once
            return self._results[kind].pop(k)
        alone: list[Any] = [None] * self.size
        alone[k] = batch
        return compute(alone)[k]

    def per_example(self, k: int, loss_fn: LossFn, batch: Any
                    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Return seed ``k``'s per-example gradients and losses on ``batch``."""
        return self._rows("examples", k, batch, lambda batches: self.compute(batches, loss_fn))

    def linear_rows(self, k: int, loss_fn: LossFn, batch: Any) -> LinearRows:
        """Return seed ``k``'s ``LinearRows`` on ``batch``."""
        return self._rows("linear", k, batch,
                          lambda batches: self.linear_compute(batches, loss_fn))

    def linear_compute(self, batches: Sequence[Any], loss_fn: LossFn) -> list[LinearRows]:
        """Return each seed's ``LinearRows`` from one batched forward and one backward.

        The K seeds' layers run as one batched matrix product each (``torch.baddbmm`` over
        the stacked weights); one backward of the summed per-example losses with respect to
        the layers' outputs gives every example's output gradient ``g`` (the losses are
        independent, so d(sum)/dz_i = dloss_i/dz_i), recorded with each layer's input ``a``.
        """
        sizes = [0 if b is None else batch_size(b) for b in batches]
        rows = max(sizes)
        template = next(b for b in batches if b is not None)
        empty = map_tensors(lambda t: t[:0], template)
        stacked_batch = _stack_batches([_padded(empty if b is None else b, rows)
                                        for b in batches])
        count = self.size
        x = stacked_batch[0]
        flat = x.reshape(count * rows, *x.shape[2:])
        layer_io: list[tuple[torch.Tensor, torch.Tensor]] = []
        params = dict(zip(self.names, (torch.stack([p[j].detach() for p in self.params])
                                       for j in range(len(self.names)))))

        def forward(inputs: torch.Tensor) -> torch.Tensor:
            a = inputs.reshape(count, rows, *inputs.shape[1:])
            for name, module in self.layers:
                if isinstance(module, nn.Linear):
                    weight = params[f"{name}.weight"]
                    bias = params.get(f"{name}.bias")
                    z = (torch.baddbmm(bias.unsqueeze(1), a, weight.transpose(1, 2))
                         if bias is not None else torch.bmm(a, weight.transpose(1, 2)))
                    if not z.requires_grad:  # the first layer: the graph starts here
                        z.requires_grad_(True)
                    layer_io.append((a.detach(), z))
                    a = z
                elif isinstance(module, nn.Flatten):
                    a = a.reshape(count, rows, -1)
                else:  # an element-wise activation
                    a = module(a)
            return a.reshape(count * rows, *a.shape[2:])

        one = type(stacked_batch)([flat, *(t.reshape(count * rows, *t.shape[2:])
                                           for t in stacked_batch[1:])])
        losses = loss_fn(forward, one)
        outputs = [z for _, z in layer_io]
        grads = torch.autograd.grad(losses.sum(), outputs) if rows else [
            torch.zeros_like(z) for z in outputs]
        losses = losses.detach().reshape(count, rows)
        out = []
        for k, n in enumerate(sizes):
            io = [(a[k, :n], g[k, :n]) for (a, _), g in zip(layer_io, grads)]
            out.append(LinearRows(io, losses[k, :n]))
        return out

    def compute(self, batches: Sequence[Any], loss_fn: LossFn
                ) -> list[tuple[list[torch.Tensor], torch.Tensor]]:
        """Return, for each seed k, (per-example gradients [n_k, ...] per parameter, losses
        [n_k]) on ``batches[k]`` (None: no rows) at seed k's current parameters."""
        sizes = [0 if b is None else batch_size(b) for b in batches]
        rows = max(sizes)
        template = next((b for b in batches if b is not None), None)
        if rows == 0 or template is None:
            return [([p.new_zeros((0, *p.shape)) for p in params],
                     params[0].new_zeros(0) if params else torch.zeros(0))
                    for params in self.params]
        empty = map_tensors(lambda t: t[:0], template)
        padded = [_padded(empty if b is None else b, rows) for b in batches]
        stacked_batch = _stack_batches(padded)
        stacked = tuple(torch.stack([params[j].detach() for params in self.params])
                        for j in range(len(self.names)))
        names, base = self.names, self.base

        def example_loss(params: tuple[torch.Tensor, ...], example: Any):
            one = map_tensors(lambda t: t.unsqueeze(0), example)
            loss = loss_fn(_At(base, dict(zip(names, params))), one)[0]
            return loss, loss.detach()

        per_seed = vmap(vmap(grad(example_loss, has_aux=True), in_dims=(None, 0)),
                        in_dims=(0, 0))
        grads, losses = per_seed(stacked, stacked_batch)
        return [([g[k, :n] for g in grads], losses[k, :n]) for k, n in enumerate(sizes)]


def _stack_batches(batches: Sequence[Any]) -> Any:
    """Return the K padded batches as one batch with a leading seed dimension."""
    first = batches[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(list(batches))
    if isinstance(first, dict):
        return {key: _stack_batches([b[key] for b in batches]) for key in first}
    if isinstance(first, (list, tuple)):
        return type(first)(_stack_batches([b[i] for b in batches]) for i in range(len(first)))
    return first


class MemberEngine:
    """Seed k's engine in a ``SeedGroup`` (mode ``seed_group``): materialised per-example
    gradients from the group's vectorised call, clipped and summed by ``clip_materialised``
    with the seed's own clip factors."""

    mode = "seed_group"
    materialises = True
    combines_points_supported = True
    float32_handover = False

    def __init__(self, group: SeedGroup, k: int) -> None:
        self.group, self.k = group, k
        self.params = group.params[k]
        self.names = list(group.names)
        self.combines_points = False

    def per_example(self, loss_fn: LossFn, batch: Any) -> tuple[list[torch.Tensor],
                                                                 torch.Tensor]:
        return self.group.per_example(self.k, loss_fn, batch)

    def clipped_sum(self, loss_fn: LossFn, batch: Any, points: Sequence[Point],
                    factors_fn: FactorsFn, observe: Observer | None = None) -> ClippedSum:
        linear = (self.group.layers is not None and observe is None and len(points) == 1
                  and points[0].weight == 1.0 and points[0].offsets is None)
        if not linear:  # materialised per-example gradients (vmap), then Algorithm 1
            return clip_materialised(self.per_example, self.params, self.names, loss_fn,
                                     batch, points, factors_fn, observe)
        rows = self.group.linear_rows(self.k, loss_fn, batch)
        has_bias = self._has_bias()
        norms = rows.norms(has_bias)
        kept = kept_examples(norms, [rows.losses]).cpu()
        loss = rows.losses
        if not bool(kept.all()):  # a dropped example contributes 0 (its rows zeroed)
            keep = kept.to(norms.device)
            rows = LinearRows([(zero_rows(a, keep), zero_rows(g, keep)) for a, g in rows.io],
                              rows.losses)
            norms = torch.where(keep, norms, torch.zeros_like(norms))
            loss = loss[keep]
        factors = factors_fn(norms)
        factors = torch.where(kept.to(factors.device), factors, torch.zeros_like(factors))
        return ClippedSum(rows.sums(factors, has_bias), norms, factors, loss, kept)

    def _has_bias(self) -> list[bool]:
        layers = self.group.layers or []
        return [m.bias is not None for _, m in layers if isinstance(m, nn.Linear)]

    def close(self) -> None:  # no hooks
        return None


def epoch_batches(trainer: Any) -> Iterator[Any]:
    """Return ``trainer.epoch_batches()``'s batches, the same tensors, fetched by indexing.

    For the common case (a ``TensorDataset``, or ``Subset``s of one, under Opacus's Poisson
    batch sampler, one process, no worker processes) each batch is ``[t[idx] for t in
    dataset.tensors]`` with ``idx`` the mask the seed's own sampler draws (through the
    subsets' indices), which is what the loader's example-by-example
    fetch and ``default_collate`` build (an empty mask gives the same empty tensors); the
    loader's own per-epoch draw from the sampler stream is made first, as ``iter(loader)``
    makes it, and a resumed epoch skips the same draw (``sampling.remaining_batches``).
    Anything else: the Trainer's own loader.
    """
    loader = trainer.train_loader
    found = tensor_rows(getattr(loader, "dataset", None))
    if not (found is not None and loader.num_workers == 0
            and isinstance(loader.batch_sampler, UniformWithReplacementSampler)
            and loader.collate_fn is not None and not trainer.collective.distributed):
        return trainer.epoch_batches()
    tensors, rows = found
    generator, done = trainer.sampler_generator, trainer.epoch_step
    saved = generator.get_state() if done else None
    iter(loader)  # the loader's per-epoch draw (its iterator's base seed)
    if saved is not None:
        generator.set_state(saved)
    masks = iter(loader.batch_sampler)
    if done:
        masks = itertools.islice(masks, max(trainer.plan.steps_per_epoch - done, 0))

    def fetch(idx: Any) -> list[torch.Tensor]:
        chosen = torch.as_tensor(idx, dtype=torch.long)
        if rows is not None:
            chosen = rows[chosen]
        return [t[chosen] for t in tensors]
    return (fetch(idx) for idx in masks)


def group_engines(trainers: Sequence[Any]) -> SeedGroup:
    """Return the group of ``trainers`` (each a ``Trainer`` of one seed, built as a separate
    run would be), each seed's engine replaced by its member engine after the per-run check
    passed on it (a failure refuses that seed: ``ConfigError``)."""
    if len({t.settings.epochs for t in trainers}) > 1:
        raise ConfigError("the seeds of a group must train for one number of epochs")
    group = SeedGroup([t.model for t in trainers])
    for k, trainer in enumerate(trainers):
        trainer.use_engine(group.member(k), "grouped")
    return group


def fit_group(trainers: Sequence[Any], group: SeedGroup,
              stop: Callable[[], bool] | None = None) -> list[dict[str, Any]]:
    """Train the seeds of ``group`` in lockstep (``Trainer.fit``'s order, step by step);
    return each seed's summary. ``stop`` is polled after every whole step: when it holds,
    every seed checkpoints that step and ``Preempted`` is raised.

    Seeds whose epochs hold fewer steps (a smaller training set: the membership-inference
    models' random halves) sit out the epoch's last steps (no batch staged, nothing drawn)
    and end the epoch with the others; each seed still takes exactly its own steps, from its
    own sampler stream. Each epoch's time is shared equally among the seeds' ``wall_time_s``.
    """
    for trainer in trainers:
        trainer.begin()
    positions = {(t.epoch, t.epoch_step, t.step) for t in trainers}
    if len(positions) > 1:
        raise ConfigError("the seeds of a group resume from different steps "
                          f"({sorted(positions)}); resume them with trainer.seeds_at_once=1")
    first, count = trainers[0], len(trainers)
    while first.epoch < first.settings.epochs:
        start = time.perf_counter()
        for batches in itertools.zip_longest(*(epoch_batches(t) for t in trainers)):
            group.stage(batches, first.device)
            try:
                for trainer, batch in zip(trainers, batches):
                    if batch is not None:  # None: this seed's epoch has ended
                        trainer.end_step(trainer.train_step(batch))
            finally:
                group.unstage()
            if stop is not None and stop():
                for trainer in trainers:
                    trainer.pause((time.perf_counter() - start) / count)
                raise first.preempted()
        share = (time.perf_counter() - start) / count
        for trainer in trainers:
            trainer.end_epoch(share)
    return [trainer.finish() for trainer in trainers]
