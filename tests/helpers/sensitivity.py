"""Neighbouring batches through the loop's own release code: a trained trainer, the pre-noise
aggregate at a fixed RNG state, an adversarial neighbour."""

from __future__ import annotations

import torch
from torch.utils.data import default_collate

from dpbench.experiment import build_trainer
from dpbench.training.step import clipped_aggregate
from tests.helpers.config import compose_config
from tests.helpers.method_matrix import is_private, method_overrides

ADVERSARIAL_SCALE = 1e3  # the neighbour's features are scaled by this: a huge gradient


def scaled(example, scale: float, num_classes: int = 0):
    """Return ``example`` with its floating tensors times ``scale`` and class labels shifted.

    A mislabelled example with huge features has a huge gradient for any loss we ship.
    """
    if isinstance(example, torch.Tensor):
        if example.is_floating_point():
            return example * scale
        return (example + 1) % num_classes if num_classes > 0 else example
    if isinstance(example, dict):
        return {k: scaled(v, scale, num_classes) for k, v in example.items()}
    if isinstance(example, (list, tuple)):
        return type(example)(scaled(v, scale, num_classes) for v in example)
    return example


def adversarial_example(data):
    return scaled(data.train[0], ADVERSARIAL_SCALE, data.num_classes)


def trained_trainer(name: str, steps: int = 3, mode: str | None = None):
    trainer = build_trainer(compose_config(*method_overrides(name, mode)), None)
    if mode is not None and is_private(name):
        assert trainer.engine.mode == mode
    batches = iter(trainer.train_loader)
    for _ in range(steps):  # non-trivial method state before the check
        trainer.train_step(next(batches))
    return trainer


def aggregate(trainer, examples, generator_state, mechanism=None):
    """Return the pre-noise aggregate of ``examples`` at the current state (same RNG draws),
    under the trainer's mechanism or ``mechanism`` (a test double)."""
    trainer.noise_generator.set_state(generator_state)
    # the same evaluation points (IVON's posterior sample, from the method stream); tasks with
    # per-example randomness (diffusion timesteps and noise) draw from the task stream in
    # batch order: the same seed and neighbours that differ in their *last* example couple
    # every shared example to the same draws (the coupling the DP proof uses)
    for name, generator in trainer.generators.items():
        if name != "noise":
            generator.manual_seed(1234)
    torch.manual_seed(1234)
    ctx = trainer._context()
    ctx.noise_std = trainer.step_plan.released_noise_std(trainer.mechanism.sensitivity(ctx))
    batch = default_collate(examples)
    return clipped_aggregate(mechanism or trainer.mechanism, trainer.engine, trainer.task,
                             batch, ctx, trainer.step_plan, None), ctx


def distance(a, b) -> float:
    return float(torch.sqrt(sum(((x - y) ** 2).sum() for x, y in zip(a.sums, b.sums))))
