"""dpbench-mia's target and reference models trained K at a time (``trainer.seeds_at_once``).

With ``trainer.seeds_at_once=K > 1`` the run's models are built K at a time, each exactly as
when it trains alone (``experiment.build`` of its own seed on its own half of the pool: its
model initialised from its own stream, its own Poisson sampler stream, noise stream, ledger
and accountant, its noise calibrated for its half), and trained in lockstep through the
sweeps' ``SeedGroup`` (``training/seed_group.py``): what the models share is one vectorised
computation of each step's per-example gradients. Each model's engine is replaced by the
group's only after the per-run check passed on it; the halves differ in size, so a model
with fewer steps per epoch sits out the epoch's last steps. What cannot be grouped is
refused in one line before any model is built (``grouping_refusal``). docs/engine.md,
"Many seeds at once".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from dpbench.errors import ConfigError
from dpbench.spec import RunSpec


def grouping_check(spec: RunSpec) -> None:
    """Raise ConfigError (one line) when the run's models cannot train K at a time."""
    from dpbench.training.seed_group import spec_refusal

    reason = spec_refusal(spec)
    if reason is not None:
        raise ConfigError(f"dpbench-mia: {reason}")


def trained_models(spec: RunSpec, count: int, build_one: Callable[[int], Any]
                   ) -> Iterator[tuple[Any, dict[str, Any]]]:
    """Yield (trainer, summary) of models 0 .. ``count`` - 1 in order, each trained:
    one at a time, built then trained (``trainer.seeds_at_once=1``), or K at a time in a
    seed group. ``build_one(k)`` builds model k's Trainer."""
    at_once = spec.trainer.seeds_at_once
    if at_once == 1:
        for k in range(count):
            trainer = build_one(k)
            yield trainer, trainer.fit()
        return
    from dpbench.training.seed_group import fit_group, group_engines

    grouping_check(spec)  # before any model is built
    for start in range(0, count, at_once):
        trainers = [build_one(k) for k in range(start, min(start + at_once, count))]
        tasks = {t.data.task for t in trainers} - {"classification"}
        if tasks:
            raise ConfigError(f"dpbench-mia: trainer.seeds_at_once supports classification, "
                              f"not a {tasks.pop()} task")
        yield from zip(trainers, fit_group(trainers, group_engines(trainers)))
