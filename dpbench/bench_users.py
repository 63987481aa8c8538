"""``dpbench-bench --users K``: the cost of per-user clipping (privacy.unit=user, ULS) per engine.

For each image model: the median time of one DP-SGD step whose rows form users of K rows each
(contiguous, as the user-level loader hands them), clipped per user
(``engine.clipped_user_sum``: each user's gradient sum before its norm) in each dpbench
grad-sample mode, divided by the non-private step's on the same batch, and by the ``hooks``
per-user step's (materialised per-example gradients added per user, the reference path).
Warm-up, then repetitions that rotate the order, in one process (``bench._time_steps``).
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable

import torch

from dpbench.methods import get_method
from dpbench.methods.base import StepContext
from dpbench.training.engine.choice import build_engine
from dpbench.training.step import plan_at, private_release

#: the reference per-user path each mode is compared with
REFERENCE = "hooks"


def contiguous_users(rows: int, per_user: int) -> torch.Tensor:
    """Return user ids of ``rows`` rows, ``per_user`` consecutive rows each (the last fewer)."""
    return torch.arange(rows) // per_user


def user_step(model, mode: str, batch, users: torch.Tensor, task,
              device: torch.device) -> Callable[[], None]:
    """Return one dpbench DP-SGD step clipped per user in grad-sample ``mode``."""
    engine = build_engine(model, mode)
    halves = get_method("dpsgd").configured(lambda p: torch.optim.SGD(p, lr=1e-3)).halves()
    update = halves.update
    update.params, update.optimizer = engine.params, torch.optim.SGD(engine.params, lr=1e-3)
    gen = torch.Generator(device=device).manual_seed(0)
    count = float(len(torch.unique(users)))
    ctx = StepContext(step=0, epoch=0, private=True, noise_multiplier=1.0, clip_norm=1.0,
                      expected_batch_size=count, sample_rate=0.01,
                      dataset_size=int(count) * 100, total_steps=1)
    plan = plan_at(halves.mechanism, 1.0, count)

    def step() -> None:
        release = private_release(halves.mechanism, engine, task, batch, ctx, plan, None,
                                  noise=gen, users=users)
        update.update(release.grads, ctx)
    return step


def bench_users(name: str, modes: list[str], batch: int, shape, per_user: int,
                device: torch.device, reps: int, warmup: int,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Return the median step time (s) of "nonprivate" and "<mode> per user" on one model."""
    from dpbench.bench import _nonprivate_step, _task, _time_steps, model_and_batch

    torch.manual_seed(0)
    base, data = model_and_batch(name, shape, batch, device)
    users = contiguous_users(batch, per_user)
    task = _task(data)
    steps: dict[str, Callable[[], None]] = {"nonprivate": _nonprivate_step(base, data)}
    failed: dict[str, str] = {}
    for mode in modes:
        try:
            steps[f"{mode} per user"] = user_step(copy.deepcopy(base), mode, data, users, task,
                                                  device)
        except Exception as err:  # noqa: BLE001 - a mode a model does not support
            failed[f"{mode} per user"] = type(err).__name__
    return _time_steps(steps, failed, reps, warmup, device, clock)


def print_users_table(name: str, batch: int, per_user: int,
                      rounds: list[dict[str, float]]) -> None:
    """Print each per-user mode's median ms, and its ratios (median and range over rounds) to
    the non-private step and to the ``hooks`` per-user step."""
    from dpbench.bench import _ratio

    ref = f"{REFERENCE} per user"
    for key in rounds[0]:
        if key == "nonprivate" or any(r[key] != r[key] for r in rounds):
            continue
        t = statistics.median(r[key] for r in rounds)
        vs_base = _ratio([r[key] / r["nonprivate"] for r in rounds])
        vs_ref = (_ratio([r[key] / r[ref] for r in rounds])
                  if all(r.get(ref, float("nan")) == r.get(ref, float("nan")) for r in rounds)
                  else "-")
        users = -(-batch // per_user)
        print(f"| {name} | {key} | {batch} ({users} users of {per_user}) | "
              f"{1e3 * t:.1f} | {vs_base} | {vs_ref} |", flush=True)
