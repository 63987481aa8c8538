"""Drive a method's post-release stages (7-10) directly on synthetic released gradients."""

from __future__ import annotations

import torch

from dpbench.methods.base import DPMethod, Halves, RunInfo, StepContext
from dpbench.training.step import Release, apply_release


def info(private: bool = True) -> RunInfo:
    return RunInfo(dataset_size=1000, expected_batch_size=100.0, sample_rate=0.1,
                   total_steps=100, noise_multiplier=1.0, clip_norm=1.0, private=private,
                   task="classification", device=torch.device("cpu"))


def ctx(step: int = 0, noise_std: float = 0.0, private: bool = True) -> StepContext:
    return StepContext(step=step, epoch=0, private=private, noise_multiplier=1.0,
                       clip_norm=1.0, expected_batch_size=100.0, sample_rate=0.1,
                       dataset_size=1000, total_steps=100, noise_std=noise_std)


def set_up(method: DPMethod | Halves, params: list[torch.nn.Parameter],
           private: bool = True) -> Halves:
    """Return the method's two halves, checked and set up over ``params`` as the loop does."""
    halves = method if isinstance(method, Halves) else method.halves()
    halves.setup(params, info(private))
    return halves


def params_like(seed: int = 0, shapes=((5, 3), (3,))) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=gen)) for s in shapes]


def released_stream(steps: int, shapes=((5, 3), (3,)), seed: int = 1) -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(*s, generator=gen) * 0.1 for s in shapes] for _ in range(steps)]


def post_release(halves: Halves, grads: list[torch.Tensor], c: StepContext,
                 extras: dict[str, torch.Tensor] | None = None, points=()) -> None:
    """Apply the loop's stages 7-10 (post-processing, update, after-step, the mechanism's
    advance) to one released gradient, as ``training.step.apply_release`` does; ``points``
    are the step's evaluation points (the update reads them from ``ctx.points``)."""
    release = Release(grads=[g.clone() for g in grads], queries=[],
                      noisy_extras=dict(extras or {}), points=tuple(points))
    apply_release(halves, halves.params, release, c, skip=False)


def run_post_release(halves: Halves, stream, noise_std: float) -> None:
    """Apply stages 7-10 to each released gradient of ``stream``."""
    for t, grads in enumerate(stream):
        post_release(halves, grads, ctx(step=t, noise_std=noise_std))
