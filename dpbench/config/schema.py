"""Structured configs for the settings that must be validated before a run starts.

The dataclasses are registered in Hydra's ConfigStore (types are checked at composition);
``__post_init__`` checks ranges and runs when ``OmegaConf.to_object`` builds them, right after
composition and before anything is trained. Each message names the key and the allowed range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore

from dpbench.errors import ConfigError
from dpbench.privacy.accountant import ACCOUNTANTS
from dpbench.training.per_example import GRAD_SAMPLE_MODES


def _positive(key: str, value: float | None, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or not isinstance(value, (int, float)) or math.isnan(value) or value <= 0:
        raise ConfigError(f"{key} must be a number > 0 (got {value!r})")


@dataclass
class PrivacyConfig:
    """``conf/privacy/*.yaml``: the privacy target and the mechanism's knobs."""

    name: str = "eps3"
    enabled: bool = True
    target_epsilon: float | None = 3.0
    delta: float | None = None  # None: min(1e-5, 1/N'), N' = N rounded up to a power of ten
    accountant: str = "prv"
    clip_norm: float = 1.0
    noise_multiplier: float | None = None  # fixed sigma instead of a target epsilon

    def __post_init__(self) -> None:
        if not self.enabled:
            return
        if self.noise_multiplier is None:
            _positive("privacy.target_epsilon", self.target_epsilon)
            if math.isinf(self.target_epsilon):
                raise ConfigError("privacy.target_epsilon must be finite; use "
                                  "privacy=nonprivate for a non-private run")
        else:
            _positive("privacy.noise_multiplier", self.noise_multiplier)
        if self.delta is not None and not (0 < self.delta < 1):
            raise ConfigError(f"privacy.delta must be in (0, 1/N) (got {self.delta!r})")
        _positive("privacy.clip_norm", self.clip_norm)
        if self.accountant not in ACCOUNTANTS:
            raise ConfigError(f"privacy.accountant must be one of {', '.join(ACCOUNTANTS)} "
                              f"(got {self.accountant!r})")


@dataclass
class TrainerConfig:
    """``conf/trainer/*.yaml``: how long and how the loop runs (no privacy knobs here)."""

    epochs: int = 10
    batch_size: int = 64  # expected logical batch size B; Poisson rate q = B / N
    max_physical_batch_size: int | None = None  # virtual batches: chunks of this size
    grad_sample_mode: str = "hooks"
    device: str = "auto"
    eval_batch_size: int = 1024
    eval_every: int = 1  # epochs between evaluations (the last epoch is always evaluated)
    eval_every_steps: int = 0  # >0: also evaluate every k steps (history over steps)
    checkpoint: bool = True
    resume: bool = False
    nonfinite: str = "stop"  # NaN/Inf loss or gradient: "stop", or "skip" the update
    progress: bool = True
    cache_frozen_prefix: str = "auto"  # auto | on | off: train on cached frozen-prefix outputs

    def __post_init__(self) -> None:
        if not isinstance(self.epochs, int) or self.epochs < 1:
            raise ConfigError(f"trainer.epochs must be an integer >= 1 (got {self.epochs!r})")
        if self.batch_size < 1:
            raise ConfigError(f"trainer.batch_size must be >= 1 (got {self.batch_size!r})")
        if self.max_physical_batch_size is not None and self.max_physical_batch_size < 1:
            raise ConfigError("trainer.max_physical_batch_size must be >= 1 or null")
        if self.grad_sample_mode not in GRAD_SAMPLE_MODES:
            raise ConfigError(f"trainer.grad_sample_mode must be one of "
                              f"{', '.join(GRAD_SAMPLE_MODES)} (got {self.grad_sample_mode!r})")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"trainer.device must be auto, cpu or cuda[:i] "
                              f"(got {self.device!r})")
        if not isinstance(self.eval_every_steps, int) or self.eval_every_steps < 0:
            raise ConfigError(f"trainer.eval_every_steps must be an integer >= 0 "
                              f"(got {self.eval_every_steps!r})")
        if self.nonfinite not in ("stop", "skip"):
            raise ConfigError(f"trainer.nonfinite must be stop or skip (got {self.nonfinite!r})")


def register_schemas() -> None:
    """Register the schemas so ``conf/privacy`` and ``conf/trainer`` files are type-checked."""
    cs = ConfigStore.instance()
    cs.store(group="privacy", name="privacy_schema", node=PrivacyConfig)
    cs.store(group="trainer", name="trainer_schema", node=TrainerConfig)
