"""``dpbench-bench --users K``: the cost of per-user clipping (privacy.unit=user, ULS) per engine.

For each image model: the median time of one DP-SGD step whose rows form users of K rows each
(contiguous, as the user-level loader hands them), clipped per user
(``engine.clipped_user_sum``: each user's gradient sum before its norm) in each dpbench
grad-sample mode, divided by the non-private step's on the same batch, and by the ``hooks``
per-user step's (materialised per-example gradients added per user, the reference path).
Warm-up, then repetitions that rotate the order, in one process (``bench.bench_users``
times the steps built here).
"""

from __future__ import annotations

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
