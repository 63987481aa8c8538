"""Neighbouring batches through the loop's own release code: the pre-noise aggregate moves by
at most the sensitivity the accountant assumes, for the gradient and every extra query.

``clipped_aggregate`` is the first half of ``private_release`` (the sums the Gaussian noise is
added to), so these tests exercise exactly what training runs, at the method's evaluation
points and with its state after a few real steps (DiSK's direction, adaptive C_t, IVON's h).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import default_collate

from dpbench.errors import PrivacyError
from dpbench.experiment import build_trainer
from dpbench.training.step import SENSITIVITY_SLACK, clipped_aggregate
from tests.conftest import compose_config
from tests.method_matrix import is_private, method_mode_params, method_overrides

ADVERSARIAL_SCALE = 1e3  # the neighbour's features are scaled by this: a huge gradient


def _scaled(example, scale: float, num_classes: int = 0):
    """Return ``example`` with its floating tensors times ``scale`` and class labels shifted.

    A mislabelled example with huge features has a huge gradient for any loss we ship.
    """
    if isinstance(example, torch.Tensor):
        if example.is_floating_point():
            return example * scale
        return (example + 1) % num_classes if num_classes > 0 else example
    if isinstance(example, dict):
        return {k: _scaled(v, scale, num_classes) for k, v in example.items()}
    if isinstance(example, (list, tuple)):
        return type(example)(_scaled(v, scale, num_classes) for v in example)
    return example


def _adversary(data):
    return _scaled(data.train[0], ADVERSARIAL_SCALE, data.num_classes)


def _trained_trainer(name: str, steps: int = 3, mode: str | None = None):
    trainer = build_trainer(compose_config(*method_overrides(name, mode)), None)
    if mode is not None and is_private(name):
        assert trainer.engine.mode == mode
    batches = iter(trainer.train_loader)
    for _ in range(steps):  # non-trivial method state before the check
        trainer.train_step(next(batches))
    return trainer


def _aggregate(trainer, examples, generator_state):
    """Return the pre-noise aggregate of ``examples`` at the current state (same RNG draws)."""
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
    ctx.noise_std = trainer.step_plan.released_noise_std(trainer.method.sensitivity(ctx))
    batch = default_collate(examples)
    return clipped_aggregate(trainer.method, trainer.engine, trainer.task, batch, ctx,
                             trainer.step_plan, None), ctx


def _distance(a, b) -> float:
    return float(torch.sqrt(sum(((x - y) ** 2).sum() for x, y in zip(a.sums, b.sums))))


@pytest.mark.parametrize("name,mode", method_mode_params())
def test_neighbouring_batches_within_sensitivity(name, mode):
    if not is_private(name):
        trainer = build_trainer(compose_config(*method_overrides(name, mode)), None)
        assert not trainer.plan.private and trainer.engine is None  # nothing is released
        return
    trainer = _trained_trainer(name, mode=mode)
    state = trainer.noise_generator.get_state()
    data = trainer.data.train
    base = [data[i] for i in range(1, 17)]
    for scale in (ADVERSARIAL_SCALE, 1e2, 1e1):  # the largest scale whose gradient is finite
        adversary = _scaled(data[0], scale, trainer.data.num_classes)
        huge, ctx = _aggregate(trainer, [adversary], state)  # a non-finite one is dropped
        if huge.norms.numel() and float(huge.norms.max()) > 2 * trainer.method.sensitivity(ctx):
            break
    neighbours = {  # the differing example is last (see _aggregate)
        "added huge example": (base, base + [adversary]),
        "added ordinary example": (base, base + [data[0]]),
        "removed example": (base + [data[0]], base),
        "replaced-by-removal of the huge one": (base + [adversary], base),
    }
    for label, (d, d_prime) in neighbours.items():
        agg, ctx = _aggregate(trainer, d, state)
        agg_prime, _ = _aggregate(trainer, d_prime, state)
        bound = trainer.method.sensitivity(ctx) * (1 + SENSITIVITY_SLACK)
        assert _distance(agg, agg_prime) <= bound, f"{name}, {label}: gradient sum moved too far"
        for qname, spec in agg.extra_specs.items():
            diff = abs(float(agg.extra_sums.get(qname, 0.0))
                       - float(agg_prime.extra_sums.get(qname, 0.0)))
            assert diff <= spec.sensitivity * (1 + SENSITIVITY_SLACK), f"{name}: {qname}"
        assert [q.name for q in agg.queries] == [q.name for q in agg_prime.queries]
    huge, _ = _aggregate(trainer, [adversary], state)
    assert float(huge.norms.max()) > 2 * trainer.method.sensitivity(ctx)  # clip active


@pytest.mark.parametrize("mode", ["hooks", "bk"])
def test_unclipped_contribution_is_refused(monkeypatch, mode):
    """Negative control: with clipping switched off the loop's release refuses the batch."""
    trainer = _trained_trainer("dpsgd", steps=1, mode=mode)
    monkeypatch.setattr(trainer.method, "clip_factors", lambda norms, ctx: torch.ones_like(norms))
    adversary = _adversary(trainer.data)
    with pytest.raises(PrivacyError, match="sensitivity"):
        _aggregate(trainer, [trainer.data.train[1], adversary],
                   trainer.noise_generator.get_state())
