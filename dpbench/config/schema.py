"""Structured configs for the settings that must be validated before a run starts.

The dataclasses are registered in Hydra's ConfigStore (types are checked at composition);
``__post_init__`` checks ranges and runs when ``OmegaConf.to_object`` builds them, right after
composition and before anything is trained. Each message names the key and the allowed range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from dpbench.errors import ConfigError
from dpbench.privacy.accountant import check_accountant
from dpbench.privacy.samplers import DEFAULT_SAMPLER, check_neighbouring, check_sampler
from dpbench.privacy.user_level import (
    DEFAULT_MAX_EXAMPLES_PER_USER,
    DEFAULT_STRATEGY,
    DEFAULT_UNIT,
    check_max_examples_per_user,
    check_strategy,
    check_unit,
)
from dpbench.utils.conf import GRAD_SAMPLE_MODES, PRECISIONS, REFUSED_PRECISIONS
from dpbench.utils.ranges import (
    in_range,
    int_at_least,
    is_number,
    positive,
    positive_finite,
    require,
)

#: the smallest privacy.delta accepted: at 1e-15 the PLD accountant already returns inf and
#: PRV refuses (floating-point error); 1e-12 is accounted by all three
MIN_DELTA = 1e-12
#: the most torch threads a run may ask for (more crashes native libraries at start-up)
MAX_THREADS = 1024
#: torch threads a run may ask for per CPU core it may use (more only oversubscribes, and
#: hundreds of threads on a small machine end in a MemoryError before training)
THREADS_PER_CORE = 4


def max_threads() -> int:
    """Return the largest ``trainer.num_threads`` on this machine."""
    from dpbench.utils.threads import available_cores

    return min(MAX_THREADS, THREADS_PER_CORE * available_cores())


@dataclass
class PrivacyConfig:
    """``conf/privacy/*.yaml``: the privacy target and the mechanism's knobs."""

    name: str = "eps3"
    enabled: bool = True
    target_epsilon: float | None = 3.0
    delta: float | None = None  # None: min(1e-5, 1/N'), N' the smallest power of ten > N
    #: pld | prv | rdp (docs/accounting.md), or None: the sampler's default for its relation
    #: (pld; rdp for trainer.sampler=fixed_size), chosen and logged by ``plan_privacy``
    accountant: str | None = None
    clip_norm: float = 1.0
    noise_multiplier: float | None = None  # fixed sigma instead of a target epsilon
    #: add_remove | replace_one | zero_out | null (the sampler's own): docs/sampling.md
    neighbouring: str | None = None
    #: what one epsilon protects: example | user (all of one user's records; the data set's
    #: user partition, ``dataset.users``); docs/privacy-unit-and-streams.md
    unit: str = DEFAULT_UNIT
    #: under unit=user: uls (Poisson over users, per-user clipping) | els (Poisson over
    #: examples, at most max_examples_per_user a user kept); ``privacy/user_level.py``
    user_strategy: str = DEFAULT_STRATEGY
    #: k: the most examples of one user a step uses (uls) or the data set keeps (els)
    max_examples_per_user: int = DEFAULT_MAX_EXAMPLES_PER_USER

    def __post_init__(self) -> None:
        check_neighbouring(self.neighbouring)
        check_unit(self.unit)
        check_strategy(self.user_strategy)
        check_max_examples_per_user(self.max_examples_per_user)
        if not self.enabled:
            ignored = [f"privacy.{k}={v!r}" for k, v in (
                ("target_epsilon", self.target_epsilon),
                ("noise_multiplier", self.noise_multiplier), ("delta", self.delta))
                if v is not None]
            if ignored:
                raise ConfigError(f"privacy.enabled=false (no noise, epsilon = inf) would ignore "
                                  f"{', '.join(ignored)}; drop it or pick a private option "
                                  f"such as privacy=eps3")
            return
        if self.noise_multiplier is not None and self.target_epsilon is not None:
            raise ConfigError(
                f"privacy.noise_multiplier={self.noise_multiplier!r} and "
                f"privacy.target_epsilon={self.target_epsilon!r} are both set; a fixed sigma "
                f"ignores the target: use privacy=sigma privacy.noise_multiplier=... (target "
                f"null) or drop privacy.noise_multiplier")
        if self.noise_multiplier is None:
            positive("privacy.target_epsilon", self.target_epsilon)
            require(not math.isinf(self.target_epsilon), "privacy.target_epsilon", "finite",
                    why="; use privacy=nonprivate for a non-private run")
        else:
            positive("privacy.noise_multiplier", self.noise_multiplier)
        in_range("privacy.delta", self.delta, 0, 1, closed="()", expected="in (0, 1/N)",
                 allow_none=True)
        if self.delta is not None and self.delta < MIN_DELTA:
            raise ConfigError(f"privacy.delta={self.delta!r} is below {MIN_DELTA:g}, too small "
                              "to account (the PLD accountant returns inf at 1e-15); use a "
                              "delta such as 1/N^1.1, or null (the default)")
        positive("privacy.clip_norm", self.clip_norm)
        require(not math.isinf(self.clip_norm), "privacy.clip_norm", "finite", self.clip_norm,
                why=": an infinite bound clips nothing and the noise scaled to it is infinite")
        if self.accountant is not None:
            check_accountant(self.accountant)


@dataclass
class TrainerConfig:
    """``conf/trainer/*.yaml``: how long and how the loop runs (no privacy knobs here)."""

    epochs: int = 10
    batch_size: int = 64  # expected logical batch size B; Poisson rate q = B / N
    max_physical_batch_size: int | None = None  # virtual batches: chunks of this size
    grad_sample_mode: str = "auto"
    num_threads: int | None = None  # torch threads; null: all cores, cores // k in k-job sweeps
    device: str = "auto"
    eval_batch_size: int = 1024
    eval_every: int = 1  # epochs between evaluations (the last epoch is always evaluated)
    eval_every_steps: int = 0  # >0: also evaluate every k steps (history over steps)
    checkpoint: bool = True
    resume: bool = False
    nonfinite: str = "stop"  # NaN/Inf loss or gradient: "stop", or "skip" the update
    progress: bool = True
    cache_frozen_prefix: str = "auto"  # auto | on | off: train on cached frozen-prefix outputs
    precision: str = PRECISIONS[0]  # 32-true | bf16-mixed (a bf16 forward, float32 mechanism)
    sampler: str = DEFAULT_SAMPLER  # poisson | fixed_size | shuffle (docs/sampling.md)
    #: a ``-m seed=...`` sweep trains its seeds (dpbench-mia its models) in groups of this
    #: many, in one vectorised process (training/seed_group.py); 1: each seed alone
    seeds_at_once: int = 1

    def __post_init__(self) -> None:
        check_sampler(self.sampler)
        int_at_least("trainer.seeds_at_once", self.seeds_at_once, 1)
        int_at_least("trainer.epochs", self.epochs, 1)
        require(self.batch_size >= 1, "trainer.batch_size", ">= 1", self.batch_size)
        require(self.max_physical_batch_size is None or self.max_physical_batch_size >= 1,
                "trainer.max_physical_batch_size", ">= 1 or null", self.max_physical_batch_size)
        if self.grad_sample_mode not in GRAD_SAMPLE_MODES:
            raise ConfigError(f"trainer.grad_sample_mode must be one of "
                              f"{', '.join(GRAD_SAMPLE_MODES)} (got {self.grad_sample_mode!r})")
        most = max_threads()
        if self.num_threads is not None and (not isinstance(self.num_threads, int)
                                             or isinstance(self.num_threads, bool)
                                             or not 1 <= self.num_threads <= most):
            raise ConfigError(f"trainer.num_threads must be an integer in [1, {most}] "
                              f"({THREADS_PER_CORE} per available CPU core) or null "
                              f"(got {self.num_threads!r})")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"trainer.device must be auto, cpu or cuda[:i] "
                              f"(got {self.device!r})")
        if self.device.startswith("cuda"):
            _check_cuda(self.device)
        int_at_least("trainer.eval_every", self.eval_every, 1)
        int_at_least("trainer.eval_batch_size", self.eval_batch_size, 1)
        int_at_least("trainer.eval_every_steps", self.eval_every_steps, 0)
        if self.nonfinite not in ("stop", "skip"):
            raise ConfigError(f"trainer.nonfinite must be stop or skip (got {self.nonfinite!r})")
        if self.precision not in PRECISIONS:
            why = REFUSED_PRECISIONS.get(str(self.precision))
            raise ConfigError(
                f"trainer.precision={self.precision!r} is refused ({why}); use "
                f"{' or '.join(PRECISIONS)}" if why else f"trainer.precision must be one of "
                f"{', '.join(PRECISIONS)} (got {self.precision!r})")


def _check_cuda(device: str) -> None:
    """Raise ConfigError unless ``device`` (cuda or cuda:i) exists on this machine."""
    import torch  # here: composing a config (``--help``, ``--cfg``, a sweep) needs no torch

    if not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={device} but CUDA is not available on this machine; "
                          "use trainer.device=auto or trainer.device=cpu")
    index = device.partition(":")[2]
    if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
        raise ConfigError(f"trainer.device={device}: this machine has "
                          f"{torch.cuda.device_count()} CUDA device(s)")


#: dataset keys holding a size: a positive integer, or null for "all"
_DATASET_SIZES = ("train_subset", "train_size", "test_size", "max_train_windows",
                  "max_test_windows")


def check_seed(seed: Any) -> int:
    """Return ``seed`` if it is an integer in [0, 2**63); else raise ConfigError naming it."""
    in_range("seed", seed, 0, 2**63, closed="[)", integer=True,
             expected="an integer in [0, 2**63)")
    return seed


def check_dataset(settings: dict[str, Any]) -> None:
    """Check the dataset keys every loader shares (split fraction, subset sizes)."""
    if "train_fraction" in settings:
        in_range("dataset.train_fraction", settings["train_fraction"], 0, 1, closed="()",
                 expected="a number in (0, 1), so that neither split is empty")
    for key in _DATASET_SIZES:
        if key in settings:
            int_at_least(f"dataset.{key}", settings[key], 1, allow_none=True)
    from dpbench.data.users import users_config  # the data layer (torch) only when checking

    users_config(settings)  # the user partition's keys (dpbench/data/users.py)


def _numbers(prefix: str, node: Any):
    """Yield (dotted key, value) for every number under ``node`` (dicts and lists)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _numbers(f"{prefix}.{key}", value)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _numbers(f"{prefix}[{i}]", value)
    elif is_number(node):
        yield prefix, node


def check_method_numbers(optimizer: dict[str, Any] | None,
                         settings: dict[str, Any] | None) -> None:
    """Refuse NaN/inf optimiser values, a learning rate <= 0, and NaN method settings."""
    for key, value in _numbers("method.optimizer", optimizer or {}):
        require(math.isfinite(value), key, "a finite number", value)
    if optimizer and "lr" in optimizer:
        positive_finite("method.optimizer.lr", optimizer["lr"])
    for key, value in _numbers("method.settings", settings or {}):
        require(not math.isnan(value), key, "a number", value)


def check_privacy_matches_method(method_name: str, method_private: bool,
                                 privacy: PrivacyConfig) -> None:
    """Refuse a private privacy option for a non-private method (one truth: privacy.enabled).

    A private method with ``privacy=nonprivate`` is a non-private ablation and is allowed; a
    non-private method under a privacy target would train without noise yet record the target.
    """
    if method_private or not privacy.enabled:
        return
    got = (f"privacy.target_epsilon={privacy.target_epsilon!r}"
           if privacy.noise_multiplier is None
           else f"privacy.noise_multiplier={privacy.noise_multiplier!r}")
    raise ConfigError(f"method {method_name} is non-private; use privacy=nonprivate "
                      f"(got privacy={privacy.name}, {got})")


def register_schemas() -> None:
    """Register the schemas so ``conf/privacy``, ``conf/trainer`` and ``conf/method`` files
    are type-checked; each method's settings dataclass is ``method/settings/<name>``."""
    # the settings dataclasses without the methods' training code: composing imports no torch
    from dpbench.method_settings import SETTINGS, settings_class

    cs = ConfigStore.instance()
    cs.store(group="privacy", name="privacy_schema", node=PrivacyConfig)
    cs.store(group="trainer", name="trainer_schema", node=TrainerConfig)
    for name in SETTINGS.builtin_names():  # no entry point imported (plugins: method=plugin)
        # typed by the method's frozen dataclass, but open to overrides while composing (a
        # frozen dataclass's node is read-only); the run's settings are the frozen instance
        node = OmegaConf.structured(settings_class(name))
        OmegaConf.set_readonly(node, False)
        cs.store(group="method/settings", name=name, node=node)
