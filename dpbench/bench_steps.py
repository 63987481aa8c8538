"""The steps ``dpbench-bench`` times and its clock: one DP-SGD step per grad-sample mode, raw
Opacus's, the methods' loop steps and the non-private reference (``dpbench.bench`` parses the
command line and prints the tables; this module holds everything that needs torch).

``stopwatch`` is the harness's clock reading (the device synchronised first); the in-run
overhead timer (``dpbench.runners.overhead``) reads the same clock.
"""

from __future__ import annotations

import copy
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from dpbench.bench_presets import CACHED, EXTRA_MODELS, METHOD_MODELS, TEXT_MODELS
from dpbench.methods import get_method
from dpbench.methods.base import StepContext
from dpbench.models import get_model_builder
from dpbench.tasks import get_task
from dpbench.training.distributed import Collective
from dpbench.training.engine.choice import build_engine
from dpbench.training.step import apply_release, plan_at, private_release


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def stopwatch(device: torch.device, clock: Callable[[], float] = time.perf_counter) -> float:
    """Return ``clock()`` once the work queued on ``device`` is done (the harness's reading:
    a difference of two is the time of what ran between them)."""
    sync_device(device)
    return clock()


def _forward(model, batch):
    """Return the logits of ``batch`` (images: (x, y); text: (input_ids, mask, y))."""
    if len(batch) == 3:
        return model(input_ids=batch[0], attention_mask=batch[1])
    return model(batch[0])


def _task(batch):
    return get_task("text_classification" if len(batch) == 3 else "classification")()


def _nonprivate_step(model, batch) -> Callable[[], None]:
    task = _task(batch)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)

    def step() -> None:
        task.per_example_loss(model, batch).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def dpbench_step(model, mode: str, batch, device, collective: Collective | None = None,
                  expected_batch_size: float | None = None) -> Callable[[], None]:
    """Return one dpbench DP-SGD step (the loop's release + update) in grad-sample ``mode``;
    with ``collective``, ``batch`` is this rank's slice of a batch of ``expected_batch_size``."""
    task = _task(batch)
    engine = build_engine(model, mode)
    halves = get_method("dpsgd").configured(lambda p: torch.optim.SGD(p, lr=1e-3)).halves()
    update = halves.update
    update.params, update.optimizer = engine.params, torch.optim.SGD(engine.params, lr=1e-3)
    gen = torch.Generator(device=device).manual_seed(0)
    size = expected_batch_size or batch[0].shape[0]
    ctx = StepContext(step=0, epoch=0, private=True, noise_multiplier=1.0, clip_norm=1.0,
                      expected_batch_size=float(size), sample_rate=0.01,
                      dataset_size=int(size) * 100, total_steps=1)
    plan = plan_at(halves.mechanism, 1.0, float(size))

    def step() -> None:
        release = private_release(halves.mechanism, engine, task, batch, ctx, plan, None,
                                  noise=gen, collective=collective)
        update.update(release.grads, ctx)
    return step


def _method_step(model, method_name: str, mode: str, batch, device) -> Callable[[], None]:
    """Return one loop step of ``method_name`` (its YAML's optimiser and default settings):
    release (with the method's noise shaper, e.g. BandMF's), post-processing, update. Call it
    once before timing: DiSK and FIBER take their second evaluation point from the second step
    on (theta_{t-1} is then known)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from dpbench.methods.base import RunInfo
    from dpbench.utils.conf import CONF_DIR

    task = _task(batch)
    engine = build_engine(model, mode)
    node = OmegaConf.load(os.path.join(CONF_DIR, "method", f"{method_name}.yaml")).optimizer
    halves = get_method(method_name).configured(instantiate(node)).halves()
    size = batch[0].shape[0]
    info = RunInfo(dataset_size=size * 100, expected_batch_size=float(size), sample_rate=0.01,
                   total_steps=100, noise_multiplier=1.0, clip_norm=1.0, private=True,
                   task="classification",
                   device=device)
    halves.setup(engine.params, info)
    gen = torch.Generator(device=device).manual_seed(0)
    ctx = StepContext(step=0, epoch=0, private=True, noise_multiplier=1.0, clip_norm=1.0,
                      expected_batch_size=float(size), sample_rate=0.01,
                      dataset_size=size * 100, total_steps=100)
    plan = plan_at(halves.mechanism, 1.0, float(size))
    ctx.noise_std = plan.released_noise_std(halves.mechanism.sensitivity(ctx))
    shaper = halves.mechanism.noise_shaper(info)

    def step() -> None:
        release = private_release(halves.mechanism, engine, task, batch, ctx, plan, None,
                                  shaper, noise=gen)
        apply_release(halves, engine.params, release, ctx, skip=False)
        ctx.step += 1
    return step


def bench_methods(name: str, modes: list[str], batch: int, device: torch.device, reps: int,
                  warmup: int, clock: Callable[[], float] = time.perf_counter
                  ) -> dict[str, float]:
    """Return the median step time (s) of "nonprivate" and "<method> <mode>" for each method of
    ``METHOD_MODELS[name]`` and engine mode, repetitions interleaved (as ``bench_model``)."""
    model_name, shape, _, _, methods = METHOD_MODELS[name]
    torch.manual_seed(0)
    base = get_model_builder(model_name)(shape, 10).to(device)
    data = (torch.randn(batch, *shape, device=device),
            torch.randint(0, 10, (batch,), device=device))
    steps: dict[str, Callable[[], None]] = {"nonprivate": _nonprivate_step(base, data)}
    for method in methods:
        for mode in modes:
            steps[f"{method} {mode}"] = _method_step(copy.deepcopy(base), method, mode, data,
                                                     device)
    return _time_steps(steps, {}, reps, max(warmup, 1), device, clock)


def _cached_step(model, batch, device) -> Callable[[], None]:
    """Return the bk step on the frozen prefix's features, computed once for the batch (as
    ``trainer.cache_frozen_prefix`` computes them once per example; that one-off cost is not
    in the step time)."""
    from dpbench.training.prefix_cache import PrefixCachedModel, supports_prefix_cache

    if not supports_prefix_cache(model):
        raise ValueError("the model has no frozen prefix to cache")
    with torch.no_grad():
        model.eval()
        features = model.prefix_features(batch[0], batch[1])
        model.train()
    return dpbench_step(PrefixCachedModel(model), "bk", (features, *batch[1:]), device)


def _opacus_step(model, mode: str, batch) -> Callable[[], None]:
    """Return one step of raw Opacus ``make_private`` (its loss wrapper in ghost mode)."""
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    y = batch[-1]
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    loader = DataLoader(TensorDataset(*(t.cpu() for t in batch)), batch_size=y.shape[0])
    engine = PrivacyEngine()
    out = engine.make_private(module=model, optimizer=opt, data_loader=loader,
                              noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=False,
                              grad_sample_mode=mode, criterion=torch.nn.CrossEntropyLoss())
    dp_model, dp_opt = out[0], out[1]
    criterion = out[2] if mode == "ghost" else torch.nn.CrossEntropyLoss()

    def step() -> None:
        logits = _forward(dp_model, batch)
        loss = criterion(logits, y) if mode == "ghost" else F.cross_entropy(logits, y)
        loss.backward()
        dp_opt.step()
        dp_opt.zero_grad(set_to_none=True)
    return step


def bench_model(name: str, modes: list[str], opacus_modes: list[str], batch: int, shape,
                device: torch.device, reps: int, warmup: int,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Return the median step time (s) of each variant ("nonprivate", "dpbench <mode>",
    "opacus <mode>") on one model and batch, repetitions interleaved; failed variants map to
    nan."""
    torch.manual_seed(0)
    base, data = model_and_batch(name, shape, batch, device)
    steps: dict[str, Callable[[], None]] = {"nonprivate": _nonprivate_step(base, data)}
    failed: dict[str, str] = {}
    for mode in modes:
        try:
            steps[f"dpbench {mode}"] = dpbench_step(copy.deepcopy(base), mode, data, device)
        except Exception as err:  # a mode a model does not support
            failed[f"dpbench {mode}"] = type(err).__name__
    if name in TEXT_MODELS:
        steps[CACHED] = _cached_step(copy.deepcopy(base), data, device)
    for mode in opacus_modes:
        try:
            steps[f"opacus {mode}"] = _opacus_step(copy.deepcopy(base), mode, data)
        except Exception as err:
            failed[f"opacus {mode}"] = type(err).__name__
    return _time_steps(steps, failed, reps, warmup, device, clock)


def _time_steps(steps: dict[str, Callable[[], None]], failed: dict[str, str], reps: int,
                warmup: int, device: torch.device,
                clock: Callable[[], float]) -> dict[str, float]:
    """Return the median time of each step (warm-up first, the order rotating per
    repetition); failed variants map to nan."""
    times: dict[str, list[float]] = {k: [] for k in steps}

    def timed(fn) -> float:
        start = stopwatch(device, clock)
        fn()
        return stopwatch(device, clock) - start

    for key, fn in list(steps.items()):
        try:
            for _ in range(warmup):
                fn()
        except Exception as err:
            failed[key] = type(err).__name__
            del steps[key], times[key]
    keys = list(steps)
    for r in range(reps):
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:  # rotate the order
            times[key].append(timed(steps[key]))
    result = {k: statistics.median(v) for k, v in times.items()}
    result.update({k: float("nan") for k in failed})
    return result


def rank_step(spec: dict[str, Any], rank: int, world: int,
              device: torch.device) -> Callable[[], None]:
    """Return rank ``rank``'s bk step of ``dpbench-bench --processes``: its slice ``r::K`` of
    the batch, the release over the group's collective (``bench_processes``)."""
    model, batch = model_and_batch(spec["model"], spec["shape"], spec["batch"], device)
    mine = tuple(t[rank::world] for t in batch)
    return dpbench_step(model, spec["mode"], mine, device,
                        collective=Collective(rank=rank, world_size=world),
                        expected_batch_size=float(spec["batch"]))


def model_and_batch(name: str, shape, batch: int, device: torch.device):
    """Return (model, batch): random images and 10 labels, or token ids of length shape[0]
    with padded tails and 2 labels for a text model."""
    if name in EXTRA_MODELS:
        builder, settings = EXTRA_MODELS[name][:2]
        model = get_model_builder(builder)(shape, 10, **settings).to(device)
        return model, (torch.randn(batch, *shape, device=device),
                       torch.randint(0, 10, (batch,), device=device))
    if name not in TEXT_MODELS:
        model = get_model_builder(name)(shape, 10).to(device)
        return model, (torch.randn(batch, *shape, device=device),
                       torch.randint(0, 10, (batch,), device=device))
    model = get_model_builder(name)(None, 2, **TEXT_MODELS[name]).to(device)
    length = shape[0]
    ids = torch.randint(1000, 20000, (batch, length), device=device)
    lengths = torch.randint(length // 2, length + 1, (batch, 1), device=device)
    mask = (torch.arange(length, device=device) < lengths).long()
    return model, (ids * mask, mask, torch.randint(0, 2, (batch,), device=device))


def bench_users(name: str, modes: list[str], batch: int, shape, per_user: int,
                device: torch.device, reps: int, warmup: int,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Return the median step time (s) of "nonprivate" and "<mode> per user" on one model,
    the rows forming users of ``per_user`` rows (``bench_users.user_step``)."""
    from dpbench.bench_users import contiguous_users, user_step

    torch.manual_seed(0)
    base, data = model_and_batch(name, shape, batch, device)
    users, task = contiguous_users(batch, per_user), _task(data)
    steps: dict[str, Callable[[], None]] = {"nonprivate": _nonprivate_step(base, data)}
    failed: dict[str, str] = {}
    for mode in modes:
        try:
            steps[f"{mode} per user"] = user_step(copy.deepcopy(base), mode, data, users, task,
                                                  device)
        except Exception as err:  # a mode a model does not support
            failed[f"{mode} per user"] = type(err).__name__
    return _time_steps(steps, failed, reps, warmup, device, clock)
