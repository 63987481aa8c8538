"""What a method may know: the run's facts at set-up and the current step (no raw data)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch


@dataclass(frozen=True)
class EvalPoint:
    """A point at which per-example gradients are taken, and its weight in the combination.

    ``offsets`` (one tensor per trainable parameter, or None for theta itself) is added to the
    parameters for the evaluation and removed afterwards.
    """

    weight: float = 1.0
    offsets: Sequence[torch.Tensor] | None = None


@dataclass
class StepContext:
    """What a method may know about the current step: public facts, no raw data and no
    noise generator (the release alone holds the run's noise stream). ``points`` are the
    step's evaluation points, set by the loop before the update (IVON's posterior sample)."""

    step: int
    epoch: int
    private: bool
    noise_multiplier: float  # sigma the accountant is told (combined over the step's queries)
    clip_norm: float  # C from the privacy config (a method may use its own threshold)
    expected_batch_size: float  # B = q N: every mean divides by this, never the realised size
    sample_rate: float
    dataset_size: int
    total_steps: int
    method_generator: torch.Generator | None = None  # the method's own stream (posterior draws)
    noise_std: float = 0.0  # per-coordinate std of the released mean gradient, set by the loop
    points: tuple[EvalPoint, ...] = ()  # the mechanism's evaluation points of this step


@dataclass(frozen=True)
class Released:
    """What a mechanism's ``advance`` is handed after a step: released values only.

    ``step``: the step just taken, or None at set-up and after a restore (no release: the
    mechanism re-derives its state from the public weights and ``public``);
    ``extras``: the noisy sums of the step's extra queries (name -> scalar tensor);
    ``grads``: the released (noisy mean) gradient; ``public``: what the update publishes
    after its step (``Update.public_state``: post-processing of earlier releases, e.g. IVON's
    posterior scale). No losses, norms or realised batch size: those are not privatised.
    """

    step: int | None
    extras: Mapping[str, torch.Tensor] = field(default_factory=lambda: MappingProxyType({}))
    grads: tuple[torch.Tensor, ...] = ()
    public: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class HeldOut:
    """The held-out evaluation the loop hands an update: values only, no callable, no task,
    no loader, no training data.

    ``metrics``: the task's test metrics at the current weights; ``averaged``: the same
    metrics of the prediction averaged over the update's parameter samples
    (``Update.evaluation_samples``, e.g. IVON's Bayesian model average), None without them.
    Both are computed by the loop.
    """

    metrics: Mapping[str, Any]
    averaged: Mapping[str, Any] | None = None


@dataclass
class RunInfo:
    """Facts a method may need at set-up time."""

    dataset_size: int
    expected_batch_size: float
    sample_rate: float
    total_steps: int
    noise_multiplier: float
    clip_norm: float
    private: bool
    task: str
    device: torch.device
    extras: dict[str, Any] = field(default_factory=dict)
    #: the trainable parameters' names, in the order of ``params`` (``model.named_parameters``)
    param_names: tuple[str, ...] = ()
