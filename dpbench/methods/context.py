"""What a method may know: the run's facts at set-up and the current step (no raw data)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch


@dataclass
class StepContext:
    """What a method may know about the current step: public facts, no raw data and no
    noise generator (the release alone holds the run's noise stream)."""

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
    """The held-out evaluation the loop hands an update: the task's test metrics of a model,
    and its log-probabilities on test inputs; no training data, no task, no loader.

    ``metrics(model, predict=None)``: the task's test metrics (``predict`` replaces the
    model's log-probabilities, e.g. a posterior average); ``log_proba(model, x)``: the task's
    log-probabilities of inputs ``x``; ``device``: where the model lives.
    """

    metrics: Callable[..., dict[str, Any]]
    log_proba: Callable[[Any, torch.Tensor], torch.Tensor]
    device: torch.device


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
