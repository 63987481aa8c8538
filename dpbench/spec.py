"""A run's typed settings, validated in one pass: ``build_spec(cfg)`` -> ``RunSpec``.

Every check a run makes before it reads data is called here, once, in the order a reader
meets the keys: the seed, the folder-name values, the logger, the tuned choice (``tuned=``),
privacy, trainer, the method's privacy and sampler, its optimiser and settings, the data set,
the model and the evaluation split. Each raises the project's one-line ``ConfigError`` naming
the key, before anything is trained or any privacy is spent. What depends on the data set
(its size against the batch, delta against 1/N) is checked by the privacy plan when the
Trainer is built (``privacy/plan.py``), still before the first step.

``dpbench``, every rank of a ``torchrun`` job, ``dpbench-tune``'s trials, ``dpbench-audit``
and ``dpbench-mia`` build their run from a ``RunSpec`` (``experiment.run``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dpbench.config.schema import (
    PrivacyConfig,
    TrainerConfig,
    check_dataset,
    check_method_numbers,
    check_privacy_matches_method,
    check_seed,
)
from dpbench.config.targets import check_targets
from dpbench.data import DATASETS
from dpbench.errors import ConfigError
from dpbench.methods import get_method
from dpbench.models import MODELS
from dpbench.privacy.samplers import resolve_sampling, with_settled_accountant
from dpbench.privacy.user_level import check_user_level
from dpbench.training.user_unit import check_user_method
from dpbench.tune.choices import apply_tuned
from dpbench.utils.conf import without_added_defaults
from dpbench.utils.paths import check_path_values

#: keys that do not change what a run computes (excluded from the resume fingerprint)
_NOT_FINGERPRINTED = ("logger", "paths", "hydra", "run_name")
_NOT_FINGERPRINTED_TRAINER = ("resume", "progress", "eval_batch_size", "num_threads",
                              "seeds_at_once")
#: characters W&B refuses in a project name (it fails only after the run is set up)
_WANDB_FORBIDDEN = "/\\#?%:"


@dataclass(frozen=True)
class RunSpec:
    """One validated run: the composed config (a stored ``tuned=`` choice applied; what the
    record and ``config.yaml`` show) and its typed settings."""

    cfg: DictConfig
    seed: int
    privacy: PrivacyConfig
    trainer: TrainerConfig
    fingerprint: str  # of everything that determines the computation (safe resume)

    @property
    def method_name(self) -> str:
        return str(self.cfg.method.name)

    def with_seed(self, seed: int) -> RunSpec:
        """Return the same run under another seed (``dpbench-mia``'s models: one spawned seed
        each, ``audit/mia/split.model_seed``); nothing else changes, so nothing is checked again."""
        cfg = OmegaConf.merge(self.cfg, {"seed": seed})
        return dataclasses.replace(self, cfg=cfg, seed=seed, fingerprint=fingerprint(cfg))


def settings_of(node: Any, *drop: str) -> dict[str, Any]:
    """Return the resolved dict of a config node (``{}`` for None), without the ``drop`` keys."""
    out = OmegaConf.to_container(node, resolve=True) if node is not None else {}
    return {k: v for k, v in (out or {}).items() if k not in drop}


def _typed(cls, node: Any, group: str):
    try:
        return cls(**settings_of(node))
    except TypeError as err:
        raise ConfigError(f"{group}: {err}") from err


def fingerprint(cfg: DictConfig) -> str:
    """Return a hash of everything that determines the computation (for safe resume)."""
    data = settings_of(cfg, *_NOT_FINGERPRINTED)
    data["trainer"] = {k: v for k, v in data.get("trainer", {}).items()
                       if k not in _NOT_FINGERPRINTED_TRAINER}
    data = without_added_defaults(data)  # settings added later, at the value runs had before
    data = with_settled_accountant(data)  # privacy.accountant=null: the one a run chooses
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def check_logger(cfg: DictConfig) -> None:
    """Raise ConfigError naming the key if a logger setting would fail after set-up, or if
    its ``_target_`` is not an allowed factory."""
    logger = cfg.get("logger")
    if logger is None:
        return
    for key in ("project", "entity", "group"):
        value = logger.get(key)
        if value is not None and any(c in str(value) for c in _WANDB_FORBIDDEN):
            raise ConfigError(f"logger.{key}={value!r} may not contain any of "
                              f"{' '.join(_WANDB_FORBIDDEN)}")
    if logger.get("_target_"):
        check_targets(logger, "logger")


def check_optimizer(node: Any) -> None:
    """Raise ConfigError unless ``method.optimizer`` names an allowed optimiser with finite
    numbers (no hidden default optimiser)."""
    if not node or not node.get("_target_"):
        raise ConfigError(f"method.optimizer must name an optimiser (method.optimizer._target_"
                          f"=...; got {OmegaConf.to_container(node) if node else node!r})")
    check_targets(node, "method.optimizer")  # only allowed factories run (config/targets.py)


def check_evaluation(evaluation: Any) -> None:
    """Raise ConfigError unless ``evaluation.split`` is test, or validation with a fraction in
    (0, 1)."""
    split = (evaluation or {}).get("split", "test")
    if split == "test":
        return
    if split != "validation":
        raise ConfigError(f"evaluation.split must be test or validation (got {split!r})")
    fraction = float(evaluation.get("validation_fraction", 0.15))
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"evaluation.validation_fraction must be in (0, 1) (got {fraction})")


def check_user_unit(privacy: PrivacyConfig, trainer: TrainerConfig, method_name: str) -> None:
    """Refuse ``privacy.unit=user`` in one line naming the key, before any data is read: a
    strategy without an accountant for the sampler, relation and accountant
    (``privacy/user_level.py``) or a method not verified under the user unit. Every built-in
    engine clips per user (``training/engine/per_user.py``); one that cannot is refused when
    the engine is chosen."""
    check_user_level(privacy.user_strategy, trainer.sampler, privacy.accountant,
                     privacy.neighbouring)
    check_user_method(method_name)


def build_spec(cfg: DictConfig) -> RunSpec:
    """Return the validated ``RunSpec`` of a composed config; ConfigError naming the key.

    The one caller of every ``check_*`` of a run's settings (docs/architecture.md).
    """
    seed = check_seed(cfg.get("seed"))  # before run_name, which is built from it
    check_path_values(cfg)
    check_logger(cfg)
    cfg = apply_tuned(cfg)  # tuned=FILE: this cell's stored dpbench-tune choice
    privacy = _typed(PrivacyConfig, cfg.privacy, "privacy")
    trainer = _typed(TrainerConfig, cfg.trainer, "trainer")
    method = get_method(cfg.method.name)
    check_privacy_matches_method(cfg.method.name, method.private, privacy)
    # the sampler, relation and accountant agree (docs/sampling.md), before any data is read
    if privacy.unit == "user" and privacy.enabled and method.private:
        check_user_unit(privacy, trainer, cfg.method.name)
    resolve_sampling(trainer.sampler, privacy.neighbouring, privacy.accountant,
                     privacy.enabled and method.private)
    optimizer = cfg.method.get("optimizer")
    check_optimizer(optimizer)
    check_method_numbers(settings_of(optimizer), settings_of(cfg.method.get("settings")))
    dataset_settings = settings_of(cfg.dataset, "name", "task")
    check_dataset(dataset_settings)
    DATASETS.check_settings(cfg.dataset.name, dataset_settings)
    MODELS.check_settings(cfg.model.name, settings_of(cfg.model, "name"))
    check_evaluation(cfg.get("evaluation"))
    return RunSpec(cfg=cfg, seed=seed, privacy=privacy, trainer=trainer,
                   fingerprint=fingerprint(cfg))
