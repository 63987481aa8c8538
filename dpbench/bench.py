"""``dpbench-bench``: the cost of privacy per step, as ratios measured in one process.

For each model: the median time of one DP-SGD step (per-example work, clipping, noise,
update) in each dpbench grad-sample mode (``bk``, ``hooks``, ``ghost``, ...) and in raw
Opacus (``PrivacyEngine.make_private`` with hooks and with ghost clipping, Opacus's own loss
and optimiser), divided by the median time of one non-private step (mean-loss backward,
update) on the same batch. Warm-up first, then repetitions that rotate the order of all
variants, so drift (thermal, other load) hits each alike. The load average is printed: on a
shared machine, compare ratios from one run only.

Method rows (``METHOD_MODELS``) time whole loop steps of several methods (release, the
method's noise and post-processing, update; the methods' own optimisers) on one preset's
model and batch in each engine mode, against the first method's book-keeping step.
``--models fiber_cpu``: DP-AdamW, DiSK and FIBER on ``fiber_cifar10_cpu``'s, the cost of
the second evaluation point; ``--models bandmf_cpu``: DP-SGD and BandMF on
``fiber_mnist_cpu``'s, the cost of the correlated noise. ``--models vit_small`` is the ViT
preset's model at a CPU resolution.

``stopwatch`` is the harness's clock reading (the device synchronised first); the in-run
overhead timer (``dpbench.runners.overhead``) reads the same clock.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from dpbench.methods import get_method
from dpbench.methods.base import StepContext
from dpbench.models import get_model_builder
from dpbench.tasks import get_task
from dpbench.training.distributed import Collective
from dpbench.training.engine.choice import build_engine
from dpbench.training.step import apply_release, plan_at, private_release
from dpbench.utils.conf import GRAD_SAMPLE_MODES

#: model -> (input shape, batch size on CPU, batch size on CUDA); text models' shape is the
#: sequence length
DEFAULT_MODELS = {"mlp": ((1, 8, 8), 256, 1024), "cnn2": ((1, 28, 28), 256, 1024),
                  "resnet18": ((3, 32, 32), 64, 256)}
#: text models: (builder settings, as the SST-2 presets use them); not in the default set
#: (the packaged MiniLM is a large download for a first ``make bench``)
TEXT_MODELS = {"minilm_lora": {"layers": [4, 5]}}
#: image models outside the default set: (registry name, builder settings, input shape, CPU
#: batch, CUDA batch). ``vit_small`` is the ``fiber_cifar100_vit`` preset's model (timm's
#: ViT-small, random init) at a CPU resolution: CIFAR's 32 x 32 upsampled to 64 x 64, 16
#: patches of 16 x 16 plus the class token
EXTRA_MODELS = {"vit_small": ("pretrained", {"arch": "vit_small", "weights": False,
                                             "resolution": 64}, (3, 32, 32), 32, 256)}
#: method comparisons: (model, input shape, CPU batch, CUDA batch, methods): one step of each
#: method on a preset's model and batch, against the first method's bk step. ``fiber_cpu`` is
#: ``fiber_cifar10_cpu``: the 2-layer CNN on 3 x 32 x 32 images, B 256; DiSK and FIBER take
#: two evaluation points. ``bandmf_cpu`` is ``fiber_mnist_cpu``: the 2-layer CNN on MNIST's
#: 1 x 28 x 28, B 256; BandMF (its default b) against plain DP-SGD
METHOD_MODELS = {"fiber_cpu": ("cnn2", (3, 32, 32), 256, 1024, ("dpadamw", "disk", "fiber")),
                 "bandmf_cpu": ("cnn2", (1, 28, 28), 256, 1024, ("dpsgd", "bandmf"))}
CACHED = "dpbench bk + prefix cache"
DPBENCH_MODES = tuple(m for m in GRAD_SAMPLE_MODES if m != "auto")
OPACUS_MODES = ("hooks", "ghost")


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


def _ratio(values: list[float]) -> str:
    """Return "median x (min-max)" of per-round ratios ("1.36x (1.30-1.41)"; one round: "1.36x")."""
    mid = statistics.median(values)
    if len(values) == 1:
        return f"{mid:.2f}x"
    return f"{mid:.2f}x ({min(values):.2f}-{max(values):.2f})"


def summarise_rounds(rounds: list[dict[str, float]]) -> dict[str, tuple[float, str, str]]:
    """Return {variant: (median seconds, ratio to non-private, ratio to best Opacus)}.

    Each round is one ``bench_model`` result (fresh models, interleaved repetitions); ratios
    are formed within a round, then their median and range over rounds are reported, so a
    round's drift or allocation luck does not decide a comparison. "Best Opacus" is the
    faster raw Opacus mode of each round. A variant that failed in any round is "failed".
    """
    out: dict[str, tuple[float, str, str]] = {}
    for key in rounds[0]:
        times = [r[key] for r in rounds]
        if any(t != t for t in times):
            out[key] = (float("nan"), "failed", "-")
            continue
        vs_base = _ratio([r[key] / r["nonprivate"] for r in rounds])
        best = [min((v for k, v in r.items() if k.startswith("opacus") and v == v),
                    default=float("nan")) for r in rounds]
        vs_best = (_ratio([r[key] / b for r, b in zip(rounds, best)])
                   if key.startswith("dpbench") and all(b == b for b in best) else "-")
        out[key] = (statistics.median(times), vs_base, vs_best)
    return out


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dpbench-bench",
        description="Median DP-SGD step time / non-private step time per model, for dpbench's "
                    "grad-sample modes and raw Opacus make_private, measured in one process "
                    "(warm-up, interleaved repetitions).")
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS),
                        choices=[*DEFAULT_MODELS, *TEXT_MODELS, *EXTRA_MODELS, *METHOD_MODELS],
                        help=f"{', '.join(METHOD_MODELS)}: the methods of a preset on its "
                             "model, each against DP-AdamW's step in the same engine mode")
    parser.add_argument("--modes", nargs="+", default=list(DPBENCH_MODES),
                        choices=list(DPBENCH_MODES), help="dpbench grad-sample modes")
    parser.add_argument("--opacus-modes", nargs="*", default=list(OPACUS_MODES),
                        choices=list(OPACUS_MODES), help="raw Opacus reference rows")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="override the per-model default batch size")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3,
                        help="independent rounds (fresh models, interleaved repetitions): "
                             "the ratios are the median over rounds, with their range")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--processes", type=int, default=None,
                        help="also time the bk step split over K processes (gloo/NCCL, "
                             "bench_processes.py) against 1 process, per model")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: this thread's CPU time (needs --threads 1 on CPU); on a "
                             "loaded machine it is not inflated by waiting for a core")
    parser.add_argument("--seeds", type=int, default=None,
                        help="instead of the step tables: seeds per CPU-minute of an N-seed "
                             "sweep of the demo cell, each seed alone vs --seeds-at-once at "
                             "a time (fresh dpbench processes; bench_seeds.py)")
    parser.add_argument("--users", type=int, default=None,
                        help="time per-user clipping instead (privacy.unit=user, ULS): the "
                             "batch's rows as users of this many rows, each mode against "
                             "hooks per user (bench_users.py)")
    parser.add_argument("--seeds-at-once", type=int, default=16)
    parser.add_argument("--seed-rounds", type=int, default=1,
                        help="rounds of the two sweeps, alternating their order")
    parser.add_argument("--mia-references", type=int, default=None,
                        help="(with or without --seeds) models per CPU-minute of a dpbench-mia "
                             "cell of the demo with this many reference models, each model "
                             "alone vs all at once (fresh processes; bench_seeds.py)")
    args = parser.parse_args(argv)
    for option, value, least in (("--rounds", args.rounds, 1), ("--reps", args.reps, 1),
                                 ("--warmup", args.warmup, 0), ("--threads", args.threads, 1),
                                 ("--batch-size", args.batch_size, 1),
                                 ("--processes", args.processes, 2),
                                 ("--users", args.users, 1)):
        if value is not None and value < least:
            parser.error(f"{option} must be at least {least} (got {value})")
    for option, value in (("--seeds", args.seeds), ("--seeds-at-once", args.seeds_at_once),
                          ("--seed-rounds", args.seed_rounds),
                          ("--mia-references", args.mia_references)):
        if value is not None and value < 1:
            parser.error(f"{option} must be at least 1 (got {value})")
    if args.seeds or args.mia_references:
        from dpbench.bench_seeds import bench_mia, bench_seeds, print_seeds_table

        load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
        print(f"{time.strftime('%Y-%m-%d %H:%M')}, load average {load[0]:.1f} "
              f"(cpus {os.cpu_count()}), OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
        if args.seeds:
            print_seeds_table(args.seeds, args.seeds_at_once,
                              bench_seeds(args.seeds, args.seeds_at_once, args.seed_rounds))
        if args.mia_references:
            models = args.mia_references + 1
            print_seeds_table(models, models, bench_mia(args.mia_references, args.seed_rounds),
                              cell=f"dpbench-mia demo, 1 target + {args.mia_references} "
                                   "references", unit="models")
        return 0
    if args.device not in ("auto", "cpu") and not args.device.startswith("cuda"):
        parser.error(f"--device must be auto, cpu or cuda[:N] (got {args.device!r})")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device is available")
    if args.clock == "cpu" and (args.threads != 1 or args.device == "cuda"):
        parser.error("--clock cpu measures one thread: use it with --threads 1 on CPU")
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else ("cpu" if args.device == "auto" else args.device))
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"clock {args.clock}, load average {load[0]:.1f} (cpus {os.cpu_count()})")
    if args.users:
        _print_users(args, device, clock)
        return 0
    if any(name not in METHOD_MODELS for name in args.models):
        print("| model | variant | batch | ms / step | / non-private | / best Opacus |")
        print("|---|---|---|---|---|---|")
    method_rows = []
    for name in args.models:
        if name in METHOD_MODELS:
            _, _, b_cpu, b_gpu, methods = METHOD_MODELS[name]
            batch = args.batch_size or (b_gpu if device.type == "cuda" else b_cpu)
            modes = [m for m in args.modes if m in ("bk", "hooks", "functorch")] or ["bk"]
            rounds = [bench_methods(name, modes, batch, device, args.reps, args.warmup, clock)
                      for _ in range(args.rounds)]
            method_rows.append((name, batch, methods, modes, rounds))
            continue
        shape, b_cpu, b_gpu = DEFAULT_MODELS.get(name, ((32,), 64, 256))  # text: SST-2's
        if name in EXTRA_MODELS:
            shape, b_cpu, b_gpu = EXTRA_MODELS[name][2:]
        batch = args.batch_size or (b_gpu if device.type == "cuda" else b_cpu)
        heavy = name in ("resnet18", *EXTRA_MODELS) and device.type != "cuda"
        reps = min(args.reps, 6) if heavy else args.reps
        rounds = [bench_model(name, args.modes, args.opacus_modes, batch, shape, device, reps,
                              args.warmup, clock) for _ in range(args.rounds)]
        for key, (t, vs_base, vs_best) in summarise_rounds(rounds).items():
            if t != t:
                print(f"| {name} | {key} | {batch} | - | failed | - |")
                continue
            print(f"| {name} | {key} | {batch} | {1e3 * t:.1f} | {vs_base} | {vs_best} |",
                  flush=True)
    for name, batch, methods, modes, rounds in method_rows:
        ref = f"{methods[0]} {'bk' if 'bk' in modes else modes[0]}"
        print(f"\n| {name} | method | engine | batch | ms / step | / non-private | / {ref} |")
        print("|---|---|---|---|---|---|---|")
        for method in methods:
            for mode in modes:
                key = f"{method} {mode}"
                t = statistics.median(r[key] for r in rounds)
                vs_base = _ratio([r[key] / r["nonprivate"] for r in rounds])
                vs_ref = _ratio([r[key] / r[ref] for r in rounds])
                print(f"| {name} | {method} | {mode} | {batch} | {1e3 * t:.1f} | {vs_base} | "
                      f"{vs_ref} |", flush=True)
    if args.processes:
        _print_processes(args, device)
    return 0


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


def _print_users(args: argparse.Namespace, device: torch.device,
                 clock: Callable[[], float]) -> None:
    """Print each mode's per-user step: median ms, and its ratios (median and range over
    rounds) to the non-private step and to the ``hooks`` per-user step."""
    from dpbench.bench_users import REFERENCE

    ref = f"{REFERENCE} per user"
    print(f"| model | variant | batch | ms / step | / non-private | / {ref} |")
    print("|---|---|---|---|---|---|")
    modes = list(dict.fromkeys([REFERENCE, *args.modes]))
    for name in (m for m in args.models if m in DEFAULT_MODELS):  # the image models
        shape, b_cpu, b_gpu = DEFAULT_MODELS[name]
        batch = args.batch_size or (b_gpu if device.type == "cuda" else b_cpu)
        rounds = [bench_users(name, modes, batch, shape, args.users, device, args.reps,
                              args.warmup, clock) for _ in range(args.rounds)]
        users = -(-batch // args.users)
        for key in rounds[0]:
            if key == "nonprivate" or any(r[key] != r[key] for r in rounds):
                continue
            t = statistics.median(r[key] for r in rounds)
            vs_ref = (_ratio([r[key] / r[ref] for r in rounds])
                      if all(r[ref] == r[ref] for r in rounds) else "-")
            print(f"| {name} | {key} | {batch} ({users} users of {args.users}) | "
                  f"{1e3 * t:.1f} | {_ratio([r[key] / r['nonprivate'] for r in rounds])} | "
                  f"{vs_ref} |", flush=True)


def _print_processes(args: argparse.Namespace, device: torch.device) -> None:
    """Print the K-process bk step next to the 1-process one (rounds alternate the two)."""
    from dpbench.bench_processes import bench_processes

    k = args.processes
    print(f"\n| model | variant | batch | ms / step (1 process) | ms / step ({k} processes) "
          f"| {k} / 1 |")
    print("|---|---|---|---|---|---|")
    for name in (m for m in args.models if m in DEFAULT_MODELS):  # the image models
        shape, b_cpu, b_gpu = DEFAULT_MODELS[name]
        batch = args.batch_size or (b_gpu if device.type == "cuda" else b_cpu)
        rounds = bench_processes(name, "bk", batch, shape, k, args.reps, args.warmup,
                                 args.rounds, rank_step, device.type, args.threads or 1)
        one = statistics.median(r[0] for r in rounds)
        many = statistics.median(r[1] for r in rounds)
        print(f"| {name} | dpbench bk, {k} processes | {batch} | {1e3 * one:.1f} | "
              f"{1e3 * many:.1f} | {_ratio([r[1] / r[0] for r in rounds])} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
