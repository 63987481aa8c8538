"""Build a run from its ``RunSpec`` and train it: ``run(spec)``, shared by ``dpbench`` (every
rank), ``dpbench-tune``'s trials, the audit and the tests."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig

from dpbench.data import get_dataset_builder
from dpbench.data.base import TaskData, carve_validation
from dpbench.data.users import user_ids
from dpbench.errors import ConfigError
from dpbench.methods import get_method
from dpbench.models import get_model_builder
from dpbench.spec import RunSpec, build_spec, settings_of
from dpbench.tasks import get_task
from dpbench.training.distributed import Collective
from dpbench.training.loop import Callback, Trainer
from dpbench.training.user_unit import USERS_KEY
from dpbench.utils.seeding import seed_everything

log = logging.getLogger(__name__)


def build_method(cfg: DictConfig):
    """Return the method of a checked config (``spec.build_spec`` checked its optimiser)."""
    return get_method(cfg.method.name).configured(instantiate(cfg.method.optimizer),
                                                  **settings_of(cfg.method.get("settings")))


def select_evaluation_split(data: TaskData, evaluation: Any) -> TaskData:
    """Return ``data`` evaluated on ``evaluation.split`` (test, or a carved validation split;
    checked by ``spec.check_evaluation``)."""
    if (evaluation or {}).get("split", "test") == "test":
        return data
    return carve_validation(data, float(evaluation.get("validation_fraction", 0.15)))


def load_data(cfg: DictConfig) -> TaskData:
    """Return the data set of a checked config with its own train and test splits (nothing
    carved; ``build`` then applies ``evaluation.split``)."""
    data = get_dataset_builder(cfg.dataset.name)(**settings_of(cfg.dataset, "name", "task"))
    if cfg.dataset.get("task") and cfg.dataset.task != data.task:
        raise ConfigError(f"dataset.task is {cfg.dataset.task!r} but {data.name} is a "
                          f"{data.task!r} data set")
    return data


def build(spec: RunSpec, run_dir: str | Path | None = None,
          callbacks: list[Callback] | None = None,
          make_trainer: Callable[..., Trainer] = Trainer,
          collective: Collective | None = None) -> Trainer:
    """Load data and model, calibrate noise (the Trainer's privacy plan); train nothing yet.

    ``make_trainer`` lets the audit build the same loop with canaries (``CanaryRun``: a
    callback and an engine wrapper, no subclass);
    ``collective`` is a K-process run's process group (training/distributed.py).
    """
    cfg = spec.cfg
    seed_everything(spec.seed, "model_init")  # init depends on the seed alone
    method = build_method(cfg)
    data = select_evaluation_split(load_data(cfg), cfg.get("evaluation"))
    if spec.privacy.unit == "user":  # each training row's user (data/users.py)
        data.extras[USERS_KEY] = user_ids(data, cfg.dataset, spec.seed)
    model = get_model_builder(cfg.model.name)(
        data.input_shape, data.num_classes, **settings_of(cfg.model, "name"),
        **({"data": data} if cfg.model.get("needs_data") else {}))
    task = get_task(data.task)(data, **settings_of(cfg.get("task")))
    return make_trainer(method=method, model=model, task=task, data=data, privacy=spec.privacy,
                        trainer=spec.trainer, seed=spec.seed, run_dir=run_dir,
                        callbacks=callbacks, fingerprint=spec.fingerprint,
                        **({"collective": collective} if collective is not None else {}))


def run(spec: RunSpec, run_dir: str | Path | None = None,
        callbacks: list[Callback] | None = None,
        make_trainer: Callable[..., Trainer] = Trainer,
        collective: Collective | None = None,
        ready: Callable[[Trainer], None] | None = None,
        stop: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Build the run of ``spec`` and train it; return the training summary.

    ``ready(trainer)`` runs between building and the first step (the job wrapper resumes a
    checkpoint, writes ``config.yaml`` and tells the other ranks to start there); ``stop``
    is polled at step boundaries (a scheduler's preemption).
    """
    trainer = build(spec, run_dir, callbacks, make_trainer, collective)
    if ready is not None:
        ready(trainer)
    return trainer.fit(stop=stop)


def build_trainer(cfg: DictConfig, run_dir: str | Path | None = None,
                  callbacks: list[Callback] | None = None,
                  make_trainer: Callable[..., Trainer] = Trainer,
                  collective: Collective | None = None) -> Trainer:
    """Return the Trainer of a composed config: ``build(build_spec(cfg), ...)`` (scripts and
    tests that want the loop itself)."""
    return build(build_spec(cfg), run_dir, callbacks, make_trainer, collective)
