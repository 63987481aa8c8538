"""Build a Trainer from a composed config and run it; shared by the CLI, tests and the audit."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
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
from dpbench.data import get_dataset_builder
from dpbench.data.base import TaskData, carve_validation
from dpbench.errors import ConfigError
from dpbench.methods import get_method
from dpbench.models import get_model_builder
from dpbench.privacy.samplers import resolve_sampling
from dpbench.tasks import get_task
from dpbench.training.distributed import Collective
from dpbench.training.loop import Callback, Trainer
from dpbench.utils.conf import without_added_defaults
from dpbench.utils.seeding import seed_everything

log = logging.getLogger(__name__)

#: keys that do not change what a run computes (excluded from the resume fingerprint)
_NOT_FINGERPRINTED = ("logger", "paths", "hydra", "run_name")
_NOT_FINGERPRINTED_TRAINER = ("resume", "progress", "eval_batch_size", "num_threads")


def _settings(node: Any, *drop: str) -> dict[str, Any]:
    out = OmegaConf.to_container(node, resolve=True) if node is not None else {}
    return {k: v for k, v in (out or {}).items() if k not in drop}


def _typed(cls, node: Any, group: str):
    try:
        return cls(**_settings(node))
    except TypeError as err:
        raise ConfigError(f"{group}: {err}") from err


def fingerprint(cfg: DictConfig) -> str:
    """Return a hash of everything that determines the computation (for safe resume)."""
    data = _settings(cfg, *_NOT_FINGERPRINTED)
    data["trainer"] = {k: v for k, v in data.get("trainer", {}).items()
                       if k not in _NOT_FINGERPRINTED_TRAINER}
    data = without_added_defaults(data)  # settings added later, at the value runs had before
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def build_method(cfg: DictConfig):
    method_cls = get_method(cfg.method.name)
    node = cfg.method.get("optimizer")
    if not node or not node.get("_target_"):  # no hidden default optimiser
        raise ConfigError(f"method.optimizer must name an optimiser (method.optimizer._target_"
                          f"=...; got {OmegaConf.to_container(node) if node else node!r})")
    check_targets(node, "method.optimizer")  # only allowed factories run (config/targets.py)
    optimizer = instantiate(node)
    return method_cls(optimizer=optimizer, **_settings(cfg.method.get("settings")))


def select_evaluation_split(data, evaluation: Any):
    """Return ``data`` evaluated on ``evaluation.split`` (test, or a carved validation split)."""
    split = (evaluation or {}).get("split", "test")
    if split == "test":
        return data
    if split != "validation":
        raise ConfigError(f"evaluation.split must be test or validation (got {split!r})")
    fraction = float(evaluation.get("validation_fraction", 0.15))
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"evaluation.validation_fraction must be in (0, 1) (got {fraction})")
    return carve_validation(data, fraction)


def load_data(cfg: DictConfig) -> TaskData:
    """Return the data set of ``cfg`` with its own train and test splits (nothing carved).

    ``build_trainer`` then applies ``evaluation.split``.
    """
    dataset_settings = _settings(cfg.dataset, "name", "task")
    check_dataset(dataset_settings)
    data = get_dataset_builder(cfg.dataset.name)(**dataset_settings)
    if cfg.dataset.get("task") and cfg.dataset.task != data.task:
        raise ConfigError(f"dataset.task is {cfg.dataset.task!r} but {data.name} is a "
                          f"{data.task!r} data set")
    return data


def build_trainer(cfg: DictConfig, run_dir: str | Path | None,
                  callbacks: list[Callback] | None = None,
                  make_trainer: Callable[..., Trainer] = Trainer,
                  collective: Collective | None = None) -> Trainer:
    """Validate every setting, load data and model, calibrate noise; train nothing yet.

    ``make_trainer`` lets the audit build the same loop with canaries (``CanaryRun``: a
    callback and an engine wrapper, no subclass);
    ``collective`` is a K-process run's process group (training/distributed.py).
    """
    seed = check_seed(cfg.get("seed"))
    seed_everything(seed, "model_init")  # init depends on the seed alone
    privacy = _typed(PrivacyConfig, cfg.privacy, "privacy")
    trainer_cfg = _typed(TrainerConfig, cfg.trainer, "trainer")
    check_privacy_matches_method(cfg.method.name, get_method(cfg.method.name).private, privacy)
    # the sampler, relation and accountant agree (docs/sampling.md), before any data is read
    resolve_sampling(trainer_cfg.sampler, privacy.neighbouring, privacy.accountant,
                     privacy.enabled and get_method(cfg.method.name).private)
    check_method_numbers(_settings(cfg.method.get("optimizer")),
                         _settings(cfg.method.get("settings")))
    method = build_method(cfg)
    data = select_evaluation_split(load_data(cfg), cfg.get("evaluation"))
    model = get_model_builder(cfg.model.name)(
        data.input_shape, data.num_classes, **_settings(cfg.model, "name"),
        **({"data": data} if cfg.model.get("needs_data") else {}))
    task = get_task(data.task)(data, **_settings(cfg.get("task")))
    return make_trainer(method=method, model=model, task=task, data=data, privacy=privacy,
                       trainer=trainer_cfg, seed=seed, run_dir=run_dir,
                       callbacks=callbacks, fingerprint=fingerprint(cfg),
                       **({"collective": collective} if collective is not None else {}))
