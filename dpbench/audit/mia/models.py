"""Train a run's target and reference models through the loop; read their outputs.

Every model is built by ``experiment.build`` from the run's own ``RunSpec`` (the same
method, model, privacy settings and trainer: the attacker knows the training algorithm),
with its own seed (``split.model_seed``, ``RunSpec.with_seed``) and its training set replaced
by its half of the pool (``split.membership``), so its noise is calibrated and accounted for
that set. With ``trainer.seeds_at_once=K`` the models train K at a time
(``model_groups.py``), each still its own run. Progress (models done / total, ETA) goes to
stderr.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from dpbench.audit.broken import noise_scaled
from dpbench.audit.mia.model_groups import trained_models
from dpbench.audit.mia.settings import MIASettings
from dpbench.audit.mia.split import memberships, model_seed
from dpbench.audit.mia.users import user_memberships
from dpbench.data.base import TaskData, subset_indices
from dpbench.errors import ConfigError
from dpbench.spec import RunSpec
from dpbench.training.batches import evaluation_batches
from dpbench.training.loop import Trainer
from dpbench.training.user_unit import USERS_KEY

#: tasks whose ``collect_predictions`` gives per-example class log-probabilities: fair
#: classification's test batches carry the group as a third tensor, which scoring ignores;
#: text classification's are (input_ids, attention_mask, label)
ATTACKABLE_TASKS = ("classification", "fair_classification", "text_classification")


@dataclass
class ModelOutputs:
    """Per-example log-probabilities of the true label (and phi) of every model."""

    members: np.ndarray  # (K, n) bool: example i trained model k
    log_p_pool: np.ndarray  # (K, n) log f_k(x_i)_{y_i}
    phi_pool: np.ndarray  # (K, n) logit-scaled confidence
    log_p_population: np.ndarray  # (K, m) on the population samples z (test split)
    #: (K, A, n) phi on the pool's shifted copies (``SHIFTS``; index 0 the image as it is),
    #: with ``mia.lira_augment``; None otherwise
    phi_pool_augmented: np.ndarray | None = None
    summaries: list[dict[str, Any]] = field(default_factory=list)  # each model's run summary
    wall_time_s: float = 0.0


#: LiRA's query augmentations for image inputs (Carlini et al. 2022, Sec. VI-B: the query
#: and its shifted copies): (rows, columns) shifts, zero-filled; the first is the identity
SHIFTS = ((0, 0), (0, 1), (0, -1), (1, 0), (-1, 0))


def shift_images(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Return ``x`` (..., H, W) moved by ``rows`` down and ``cols`` right, zero-filled (a
    translation without wrap-around)."""
    out = torch.zeros_like(x)
    h, w = x.shape[-2:]
    dst_r, src_r = slice(max(rows, 0), h + min(rows, 0)), slice(max(-rows, 0), h - max(rows, 0))
    dst_c, src_c = slice(max(cols, 0), w + min(cols, 0)), slice(max(-cols, 0), w - max(cols, 0))
    out[..., dst_r, dst_c] = x[..., src_r, src_c]
    return out


def _outputs(trainer: Trainer, dataset: Dataset, shift: tuple[int, int] = (0, 0)
             ) -> tuple[np.ndarray, np.ndarray]:
    """Return (log p_y, phi) of ``trainer``'s model on ``dataset`` (its images shifted by
    ``shift``)."""
    from dpbench.audit.mia.attacks import logit_confidence

    loader = evaluation_batches(dataset, trainer.settings.eval_batch_size)
    predict = None if shift == (0, 0) else (
        lambda x: trainer.task.predict_log_proba(trainer.model, shift_images(x, *shift)))
    log_probs, labels, _ = trainer.task.collect_predictions(trainer.model, loader,
                                                            trainer.device, predict)
    lp, y = log_probs.double().numpy(), labels.numpy()
    return lp[np.arange(len(y)), y], logit_confidence(lp, y)


class _OnHalf:
    """``make_trainer`` for ``experiment.build``: the Trainer with its training set replaced
    (and, in tests only, its noise reduced: ``noise_scale`` below 1)."""

    def __init__(self, train: Dataset, noise_scale: float = 1.0,
                 users: np.ndarray | None = None, epoch_epsilon: bool = True) -> None:
        self.train, self.noise_scale, self.users = train, noise_scale, users
        self.epoch_epsilon = epoch_epsilon  # False: epsilon at the last epoch only
        self.data: TaskData | None = None

    def __call__(self, *, data: TaskData, **kwargs: Any) -> Trainer:
        if self.noise_scale != 1.0:  # TESTS ONLY
            kwargs["method"] = noise_scaled(kwargs["method"], self.noise_scale)
        if data.task not in ATTACKABLE_TASKS:
            tasks = ", ".join(ATTACKABLE_TASKS)
            raise ConfigError(f"dpbench-mia attacks classification models ({tasks}; dataset "
                              f"{data.name!r} is a {data.task!r} task)")
        if data.task == "text_classification":
            kwargs["trainer"] = _raw_sentences(kwargs["trainer"])
        self.data = TaskData(name=data.name, task=data.task, train=self.train, test=data.test,
                             num_classes=data.num_classes, input_shape=data.input_shape,
                             class_names=data.class_names, notes=list(data.notes),
                             extras=dict(data.extras))
        if self.users is not None:  # privacy.unit=user: the half's rows' users (users.py)
            self.data.extras[USERS_KEY] = self.users
        trainer = Trainer(data=self.data, epoch_epsilon=self.epoch_epsilon, **kwargs)
        if trainer.data is not self.data:
            raise ConfigError("dpbench-mia reads raw inputs: set trainer.cache_frozen_prefix="
                              "off")
        return trainer


def _raw_sentences(trainer: Any) -> Any:
    """Return the trainer settings of a text model the attack can score: the pool and the
    population are read as token ids, so the frozen prefix is not cached (``auto`` resolves
    to off: the same function, computed per step); ``on`` is refused before training."""
    if trainer.cache_frozen_prefix == "on":
        raise ConfigError("dpbench-mia scores raw sentences: set trainer.cache_frozen_prefix="
                          "auto or off")
    return replace(trainer, cache_frozen_prefix="off")


def pool_and_population(data: TaskData, settings: MIASettings) -> tuple[Dataset, Dataset]:
    """Return (the pool: ``pool_size`` examples of the training split, the population:
    ``population_size`` of the test split), both by a data-independent fixed permutation."""
    n, m = len(data.train), len(data.test)  # type: ignore[arg-type]
    if settings.pool_size > n:
        raise ConfigError(f"mia.pool_size={settings.pool_size} exceeds the {n} training "
                          f"examples of {data.name}")
    if settings.population_size > m:
        raise ConfigError(f"mia.population_size={settings.population_size} exceeds the {m} "
                          f"test examples of {data.name}")
    if settings.lira_augment and len(data.input_shape or ()) != 3:
        raise ConfigError(f"mia.lira_augment shifts images: {data.name} has inputs of shape "
                          f"{tuple(data.input_shape or ())}")
    return (Subset(data.train, subset_indices(n, settings.pool_size).tolist()),
            Subset(data.test, subset_indices(m, settings.population_size).tolist()))


def model_builder(spec: RunSpec, settings: MIASettings, pool: Dataset,
                  masks: np.ndarray, users: np.ndarray | None = None
                  ) -> Callable[[int], Trainer]:
    """Return ``build_one(k)``: model k's Trainer (``experiment.build`` of its own seed on
    the pool examples of its mask; with ``users``, each kept record's user), untrained.
    Only a target's summary reaches the record (its per-epoch history included): a reference
    model computes its epsilon at its last epoch only."""
    from dpbench.experiment import build

    def build_one(k: int) -> Trainer:
        return build(spec.with_seed(model_seed(settings.seed, k)), None, make_trainer=_OnHalf(
            Subset(pool, np.flatnonzero(masks[k]).tolist()), settings.break_noise_scale,
            None if users is None else users[masks[k]], epoch_epsilon=k < settings.targets))
    return build_one


def train_models(spec: RunSpec, settings: MIASettings, pool: Dataset,
                 population: Dataset, users: np.ndarray | None = None) -> ModelOutputs:
    """Train the run's ``settings.models`` models; return their outputs on pool and population.
    With ``users`` (each pool record's user, ``privacy.unit=user``) whole users are drawn
    (``users.user_memberships``) and each model trains on its users' records."""
    total = settings.models
    masks = (memberships(settings.seed, total, len(pool))  # type: ignore[arg-type]
             if users is None else user_memberships(settings.seed, total, users))
    rows: dict[str, list[np.ndarray]] = {"lp": [], "phi": [], "lz": [], "aug": []}
    summaries, start = [], time.perf_counter()
    build_one = model_builder(spec, settings, pool, masks, users)
    # one at a time, or trainer.seeds_at_once at a time (model_groups.py)
    for k, (trainer, summary) in enumerate(trained_models(spec, total, build_one)):
        summaries.append(summary)
        with torch.no_grad():
            lp, phi = _outputs(trainer, pool)
            lz, _ = _outputs(trainer, population)
        rows["lp"].append(lp)
        rows["phi"].append(phi)
        rows["lz"].append(lz)
        if settings.lira_augment:
            with torch.no_grad():
                rows["aug"].append(np.stack([phi] + [_outputs(trainer, pool, s)[1]
                                                     for s in SHIFTS[1:]]))
        elapsed = time.perf_counter() - start
        role = "target" if k < settings.targets else "reference"
        print(f"dpbench-mia: model {k + 1}/{total} ({role}) trained, {elapsed:.1f} s elapsed, "
              f"ETA {elapsed / (k + 1) * (total - k - 1):.1f} s", file=sys.stderr, flush=True)
    return ModelOutputs(members=masks, log_p_pool=np.stack(rows["lp"]),
                        phi_pool=np.stack(rows["phi"]), log_p_population=np.stack(rows["lz"]),
                        phi_pool_augmented=np.stack(rows["aug"]) if rows["aug"] else None,
                        summaries=summaries, wall_time_s=time.perf_counter() - start)
