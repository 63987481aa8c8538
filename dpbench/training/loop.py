"""THE loop: Poisson sampling, the method's stages, the Gaussian release, the accountant.

One logical step (docs/privacy.md): sample a Poisson batch -> ``private_release`` (the
engine's clipped sums at the method's evaluation points, extra queries, noise: ``step``) ->
ledger + accountant (``privacy.plan.account_release``) -> ``step.apply_release``
(post-processing, the update, after-step). Before the first release (and after a resume) the
per-example engine is checked against plain autograd on a few training examples
(``engine/check.py``); a wrong engine is never released from. The loop knows neither the task
nor the logging sinks; both come in from outside. The privacy plan lives in
``privacy/plan.py``, the checkpoint's contents in ``run_state.py``, the model's set-up in
``model_setup.py`` and the results schema in ``summary.py``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils.data import DataLoader

from dpbench.config.schema import PrivacyConfig, TrainerConfig
from dpbench.data.base import TaskData
from dpbench.errors import ConfigError
from dpbench.methods.base import DPMethod, HeldOut, Released, RunInfo, StepContext, Update
from dpbench.privacy import PrivacyAccountant, PrivacyLedger
from dpbench.privacy.plan import PrivacyPlan, account_release, plan_privacy, step_plan
from dpbench.privacy.user_plan import plan_user_privacy
from dpbench.tasks.base import Task
from dpbench.training.batches import evaluation_batches
from dpbench.training.distributed import Collective, device_name, resolve_device, shard_loader
from dpbench.training.engine.check import EngineVerifier, record_check
from dpbench.training.engine.choice import build_verified_engine
from dpbench.training.engine.protocol import Engine
from dpbench.training.model_setup import prepare_model
from dpbench.training.nonprivate import nonprivate_gradient, step_diagnostics
from dpbench.training.precision import with_precision
from dpbench.training.preemption import Preempted
from dpbench.training.run_state import RunCheckpoint, restore_run_state, run_state
from dpbench.training.sampling import remaining_batches, training_loader
from dpbench.training.step import apply_release, private_release
from dpbench.training.summary import run_summary
from dpbench.training.user_sampling import els_dataset, uls_loader
from dpbench.training.user_unit import UserSetup, user_setup
from dpbench.utils.seeding import run_streams, seed_everything, stream_generator
from dpbench.utils.tensors import move_to, parameters_at

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopView:
    """What the loop's callbacks are handed: the run's progress as values and its public
    weights; no noise stream, no data, no task, no model, no mechanism or update.

    ``weights``: the trainable parameters, detached (post-processing of releases; read them,
    do not write them); ``epsilon``: the accountant's answer so far, at the run's start, each
    epoch's end and the run's end (None at step events); ``record``: results.json's fields
    so far, at the end of an epoch before the last, for a callback with ``needs_record``.
    """

    step: int
    epoch: int
    plan: PrivacyPlan
    settings: TrainerConfig
    device: torch.device
    weights: tuple[torch.Tensor, ...]
    epsilon: float | None = None
    record: Mapping[str, Any] | None = None


class Callback:
    """Subscriber to the loop's events (W&B, results store, progress bar, the audit).

    Every event is handed a ``LoopView``; ``on_step_start`` runs before a step's release and
    ``on_release`` right after it is accounted (private runs only), handed the released values
    alone (``Released``: the noisy gradient and extra queries).
    """

    #: the callback reads ``view.record`` at epoch ends (the loop builds it only then)
    needs_record: ClassVar[bool] = False
    #: the callback reads a step's gradient-norm quantiles (``metrics["unprivatised"]``),
    #: which the loop computes only then
    needs_step_quantiles: ClassVar[bool] = False

    def on_run_start(self, view: LoopView) -> None: ...
    def on_step_start(self, view: LoopView) -> None: ...
    def on_release(self, view: LoopView, released: Released) -> None: ...
    def on_step_end(self, view: LoopView, metrics: dict[str, float]) -> None: ...
    def on_epoch_end(self, view: LoopView, metrics: dict[str, Any]) -> None: ...
    def on_run_end(self, view: LoopView, result: dict[str, Any]) -> None: ...


def run_plan(method: DPMethod, privacy: PrivacyConfig, trainer: TrainerConfig,
             data: TaskData, user: UserSetup | None = None) -> PrivacyPlan:
    """Return the privacy plan of a run (its rate, steps, sigma and the mechanism's bands):
    the one place it is built, read by the Trainer and by the audit's sizing.

    ``user`` (privacy.unit=user, ``user_unit.user_setup``): planned over the units its
    strategy samples (U users, or the N_k capped examples) by ``privacy.user_plan``."""
    if user is not None:
        plan, accounted = plan_user_privacy(privacy, trainer, user.facts.users,
                                            user.facts.kept_examples, method.private,
                                            method.planned_bands())
        return replace(plan, user=accounted)
    return plan_privacy(privacy, trainer, len(data.train), method.private,
                        method.planned_bands())


def averaged_prediction(task: Task, model: nn.Module, params: list[nn.Parameter],
                        samples: int, update: Update, device: torch.device
                        ) -> Callable[[torch.Tensor], torch.Tensor]:
    """Return x -> log (1/S) sum_s p(y | x; theta + offsets_s), the offsets the update's
    ``evaluation_offsets(s)`` (IVON's Bayesian model average, its paper's eq. 4); sample s
    is regenerated per batch, so no S x params memory."""

    def predict(x: torch.Tensor) -> torch.Tensor:
        log_probs = []
        for i in range(samples):
            with parameters_at(params, update.evaluation_offsets(i, device)):
                log_probs.append(task.predict_log_proba(model, x))
        return torch.logsumexp(torch.stack(log_probs), dim=0) - math.log(samples)

    return predict


class Trainer:
    """Runs one method on one task under one privacy plan; resumable from its run dir.

    Seams, so that nothing subclasses the loop: ``callbacks`` (``Callback``'s events),
    ``engine_wrapper`` (around the checked engine: the audit's canaries; the sensitivity check
    applies to what it returns, and there is no switch to turn the check off), ``materialise``
    (``auto`` builds an engine with per-example gradients), ``streams`` (checkpointed)."""

    def __init__(self, *, method: DPMethod, model: nn.Module, task: Task, data: TaskData,
                 privacy: PrivacyConfig, trainer: TrainerConfig, seed: int,
                 run_dir: str | Path | None = None, callbacks: list[Callback] | None = None,
                 fingerprint: str = "", collective: Collective | None = None,
                 engine_wrapper: Callable[[Engine], Engine] | None = None,
                 materialise: bool = False,
                 streams: dict[str, torch.Generator] | None = None,
                 epoch_epsilon: bool = True) -> None:
        self.method = method  # the frozen record; the loop calls its halves, built here
        self.halves = method.halves()
        self.mechanism, self.update = self.halves.mechanism, self.halves.update
        self.collective = collective or Collective()  # 1 process unless torchrun (distributed.py)
        self.settings, self.seed, self.fingerprint = trainer, seed, fingerprint
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.checkpoint = RunCheckpoint(self.run_dir, trainer)
        self.callbacks = callbacks or []
        # False: a model whose per-epoch epsilons nobody reads (an MIA reference model: no
        # folder, no callbacks) computes its epsilon at the last epoch only (``end_epoch``)
        self.epoch_epsilon = epoch_epsilon
        self.device = resolve_device(trainer.device, self.collective)
        # privacy.unit=user: each row's user and the per-user cap (None: the unit is an example)
        self.user = (user_setup(privacy, trainer, method, data, seed,
                                self.collective.distributed)
                     if method.private and privacy.enabled else None)
        self.plan = run_plan(method, privacy, trainer, data, self.user)
        names = {id(p): name for name, p in model.named_parameters()}
        self.model, self.data = prepare_model(method, model, data, self.device, trainer,
                                              self.plan.private, seed)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.engine_checks: list[dict[str, Any]] = []  # the per-run checks (initial, resumes)
        self.engine_rejected: list[dict[str, Any]] = []  # engines auto tried and rejected
        self.grad_sample_mode = self.engine = None
        # the per-run engine check (float32 forward) on the first training rows, its own
        # stream afresh each time: the run's results are those it would have without it
        self._verifier = lambda: EngineVerifier(
            self.model, task.per_example_loss, self.data.train, self.device, task=task,
            generator=stream_generator(seed, "engine_check"))
        if self.plan.private:  # the engine is chosen and checked before any release
            self.engine, check, self.engine_rejected = build_verified_engine(
                trainer.grad_sample_mode, self.model, method, task, self._verifier(),
                materialise, trainer.precision,
                per_user=self.user is not None and self.user.per_user_clipping)
            self.grad_sample_mode = self.engine.mode
            record_check(self.engine_checks, check, "start", step=0)
            if engine_wrapper is not None:  # e.g. the audit's canary rows (after the check)
                self.engine = engine_wrapper(self.engine)
        # the units the sampler draws from: examples, or (privacy.unit=user) U users / N_k rows
        self.units = self.plan.sampling.dataset_size if self.user else len(data.train)
        self.info = RunInfo(
            dataset_size=self.units, expected_batch_size=self.plan.expected_batch_size,
            sample_rate=self.plan.sample_rate, total_steps=self.plan.total_steps,
            noise_multiplier=self.plan.noise_multiplier, clip_norm=privacy.clip_norm,
            private=self.plan.private, task=data.task, device=self.device,
            param_names=tuple(names.get(id(p), "") for p in self.params))
        self.halves.setup(self.params, self.info)  # the mechanism's validate, both set-ups
        bands = self.mechanism.participation_bands()
        # the mechanism of every step, fixed once (privacy/plan.py): rate, sigma, sigma_g, bands
        self.step_plan = step_plan(
            self.plan, self.mechanism.gradient_noise_multiplier(self.plan.noise_multiplier)
            if self.plan.private else 0.0, cyclic=bands is not None)
        self.noise_shaper = self.mechanism.noise_shaper(self.info) if self.plan.private else None
        self.clip_norm = privacy.clip_norm
        self.accountant = (PrivacyAccountant(self.plan.accountant, self.plan.sampling,
                                             user=self.plan.user)
                           if self.plan.private else None)
        self.ledger = PrivacyLedger()
        self.generators = {**run_streams(seed, self.device, self.collective.rank
                                         if self.collective.distributed else None),
                           **(streams or {})}  # one spawned seed each (utils/seeding.py)
        self.sampler_generator = self.generators["sampler"]
        self.noise_generator = self.generators["noise"]
        task.generator = self.generators["task"]
        self.task = with_precision(task, trainer.precision, self.device)  # forward only
        seed_everything(seed, "global")  # what still draws from torch's global RNG (dropout)
        loader, self.batch_sampler = self._training_loader(seed, cyclic=bands is not None)
        # K processes: the global batch (any sampler), each rank its slice (distributed.py)
        self.train_loader = shard_loader(loader, self.collective)
        self.devices = self.collective.gather_strings(device_name(self.device))
        # in order, by slicing where the test set is tensors (DataLoader's very batches)
        self.test_loader = evaluation_batches(self.data.test, trainer.eval_batch_size)
        self.step = self.epoch = self.epoch_step = 0  # epoch_step: steps done in this epoch
        self.history: list[dict[str, Any]] = []
        self.step_history: list[dict[str, Any]] = []  # evaluations every eval_every_steps
        self.unprivatised_history: list[dict[str, Any]] = []  # un-privatised task diagnostics
        self.wall_time_s, self.skipped_steps = 0.0, 0
        self._resume_verified = False  # the engine checked again after a resume

    def _training_loader(self, seed: int, cyclic: bool) -> tuple[DataLoader, Any]:
        """Return the training loader and its stateful sampler: ``trainer.sampler``'s, or under
        privacy.unit=user Poisson over users (ULS, batches of (rows, user ids)) or over the
        rows kept under the cap (ELS); ``user_sampling.py``."""
        if self.user is None:
            return training_loader(self.data.train, self.plan, seed, self.sampler_generator,
                                   cyclic=cyclic)
        if self.user.per_user_clipping:
            return uls_loader(self.data.train, self.user.users, self.user.kept,
                              self.plan.sample_rate, self.plan.steps_per_epoch,
                              self.sampler_generator)
        return training_loader(els_dataset(self.data.train, self.user.kept), self.plan, seed,
                               self.sampler_generator, cyclic=False)

    def epsilon(self) -> float:
        return self.accountant.get_epsilon(self.plan.delta) if self.plan.private else math.inf

    def _context(self) -> StepContext:
        return StepContext(
            step=self.step, epoch=self.epoch, private=self.plan.private,
            noise_multiplier=self.plan.noise_multiplier, clip_norm=self.clip_norm,
            expected_batch_size=self.plan.expected_batch_size,
            sample_rate=self.plan.sample_rate, dataset_size=self.units,
            total_steps=self.plan.total_steps, method_generator=self.generators["method"])

    def train_step(self, batch: Any) -> dict[str, Any]:
        """One logical step: release (private) or exact gradient, then the update."""
        users = None
        if self.user is not None and self.user.per_user_clipping:  # ULS: (rows, user ids)
            batch, users = batch
        ctx, batch = self._context(), move_to(batch, self.device)
        physical = self.settings.max_physical_batch_size
        if self.plan.private:
            self._emit("on_step_start")
            ctx.noise_std = self.step_plan.released_noise_std(self.mechanism.sensitivity(ctx))
            release = private_release(self.mechanism, self.engine, self.task, batch, ctx,
                                      self.step_plan, physical, self.noise_shaper,
                                      noise=self.noise_generator, collective=self.collective,
                                      users=users)
            # the release happened: account before anything can fail
            account_release(self.plan, self.ledger, self.accountant, self.step, release.queries)
            self._emit("on_release", Released(
                step=self.step, extras=MappingProxyType(release.noisy_extras),
                grads=tuple(release.grads)))
        else:
            release = nonprivate_gradient(self.mechanism, self.model, self.params, self.task,
                                          batch, ctx, physical, collective=self.collective)
        if not apply_release(self.halves, self.params, release, ctx,
                             self.settings.nonfinite == "skip", epoch=self.epoch):
            self.skipped_steps += 1  # trainer.nonfinite=skip: restored, still accounted
        self.step += 1
        return {"step": self.step, **self.halves.step_metrics(),
                "unprivatised": step_diagnostics(release, self.task, quantiles=any(
                    getattr(cb, "needs_step_quantiles", False) for cb in self.callbacks))}

    def _emit(self, event: str, *args: Any,
              epsilon: Callable[[], float] | None = None) -> None:
        """Call ``event`` on every callback that has it (``Callback`` has them all), handing
        each the same ``LoopView``."""
        handlers = [h for h in (getattr(cb, event, None) for cb in self.callbacks) if h]
        if not handlers:
            return
        record = (self.summary() if event == "on_epoch_end" and self.epoch < self.settings.epochs
                  and any(getattr(cb, "needs_record", False) for cb in self.callbacks) else None)
        view = LoopView(step=self.step, epoch=self.epoch, plan=self.plan,
                        settings=self.settings, device=self.device,
                        weights=tuple(p.detach() for p in self.params),
                        epsilon=epsilon() if epsilon is not None else None, record=record)
        for handler in handlers:
            handler(view, *args)

    def held_out(self) -> HeldOut:
        """Return the values an update's evaluation is handed: the task's test metrics at the
        current weights and, when the update draws parameter samples, those of the averaged
        prediction (``averaged_prediction``); no callable, no task, no data."""
        metrics = self.task.evaluate(self.model, self.test_loader, self.device)
        samples = self.update.evaluation_samples()
        averaged = None if samples == 0 else self.task.evaluate(
            self.model, self.test_loader, self.device, predict=averaged_prediction(
                self.task, self.model, self.params, samples, self.update, self.device))
        return HeldOut(metrics=metrics, averaged=averaged)

    def evaluate(self) -> dict[str, Any]:
        return self.update.evaluate(self.held_out())

    def _evaluated(self, where: dict[str, int]) -> dict[str, Any]:
        """Return the test metrics; file the task's un-privatised diagnostics apart."""
        metrics, diagnostics = self.evaluate(), self.task.diagnostics_summary()
        if diagnostics:
            self.unprivatised_history.append({**where, **diagnostics})
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return run_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        restore_run_state(self, state)

    @property
    def checkpoint_path(self) -> Path | None:
        return self.checkpoint.path

    def maybe_resume(self) -> bool:
        """Load the run dir's checkpoint when ``trainer.resume``; return whether one was found
        (the CLI resumes at set-up, before ``fit``)."""
        return self.checkpoint.resume_into(self)

    def fit(self, stop: Callable[[], bool] | None = None) -> dict[str, Any]:
        """Train for the planned epochs (continuing a resumed run); return the run summary.

        ``stop`` (e.g. ``PreemptionWatch.requested``) is polled after every whole step; when
        it holds on any rank, the run checkpoints that step and raises ``Preempted``. The
        pieces (``begin``, ``epoch_batches``, ``train_step``, ``end_step``, ``end_epoch``,
        ``finish``) are public so that a group of runs can be driven in lockstep
        (``training/seed_group.py``); this is the one order they run in.
        """
        self.begin()
        while self.epoch < self.settings.epochs:
            start = time.perf_counter()
            for batch in self.epoch_batches():
                self.end_step(self.train_step(batch))
                if stop is not None and self.collective.any(stop(), self.device):
                    self.pause(time.perf_counter() - start)
                    raise self.preempted()
            self.end_epoch(time.perf_counter() - start)
        return self.finish()

    def begin(self) -> None:
        """Resume (when ``trainer.resume``), check a resumed engine again, start the callbacks."""
        self.maybe_resume()
        self.checkpoint.sync_from_main(self)
        if self.checkpoint.resumed and self.plan.private and not self._resume_verified:
            # the resumed weights and this process's engine: checked again before releasing
            self.check_engine("resume")
            self._resume_verified = True
        self._emit("on_run_start", epsilon=self.epsilon)
        self.model.train()

    def check_engine(self, when: str) -> None:
        """Run the per-run check (``engine/check.py``) on the current engine and record it;
        a failed check refuses the run (``ConfigError``) before any release."""
        record_check(self.engine_checks, self._verifier().check(self.engine), when,
                     step=self.step)

    def use_engine(self, engine: Engine, when: str) -> None:
        """Replace the checked engine by ``engine`` (a seed group's member engine) before
        ``fit`` (or ``begin``), checked first by the per-run check at the current weights: the
        run releases only from an engine that passed it. The engine it replaces is closed
        (its hooks removed)."""
        if not self.plan.private:
            raise ConfigError("an engine is replaced only in a private run")
        previous, self.engine = self.engine, engine
        try:
            self.check_engine(when)
        except ConfigError:
            self.engine = previous
            raise
        previous.close()
        self.grad_sample_mode = engine.mode

    def epoch_batches(self) -> Iterator[Any]:
        """Return the current epoch's remaining batches, from the run's own sampler stream."""
        return remaining_batches(self.train_loader, self.sampler_generator, self.epoch_step,
                                 self.plan.steps_per_epoch)

    def end_step(self, metrics: dict[str, Any]) -> None:
        """After a step: the step callbacks and the every-k-steps evaluation."""
        self.epoch_step += 1
        self._emit("on_step_end", metrics)
        every = self.settings.eval_every_steps
        if every and self.step % every == 0:
            self.step_history.append({"step": self.step, "epsilon": self.epsilon(),
                                      **self._evaluated({"step": self.step})})

    def pause(self, seconds: float) -> None:
        """Checkpoint a whole step for a preemption (``seconds``: this epoch's time so far)."""
        self.wall_time_s += seconds
        self.checkpoint.save(self)

    def preempted(self) -> Preempted:
        """Return the ``Preempted`` a paused run raises."""
        return Preempted(f"preempted at step {self.step} (epoch {self.epoch}); its checkpoint "
                         "is saved: run again with trainer.resume=true to continue")

    def end_epoch(self, seconds: float) -> None:
        """At an epoch's end (``seconds``: its time): epsilon, evaluation, checkpoint."""
        self.epoch, self.epoch_step = self.epoch + 1, 0
        self.wall_time_s += seconds
        read = (self.epoch_epsilon or self.epoch == self.settings.epochs or self.callbacks
                or self.run_dir is not None)
        row: dict[str, Any] = {"epoch": self.epoch, "step": self.step,
                               "epsilon": self.epsilon() if read else None}
        if self.epoch == self.settings.epochs or self.epoch % self.settings.eval_every == 0:
            row.update(self._evaluated({"epoch": self.epoch, "step": self.step}))
        self.history.append(row)
        self.checkpoint.save(self)
        self._emit("on_epoch_end", row, epsilon=lambda r=row: r["epsilon"])

    def finish(self) -> dict[str, Any]:
        """Return the run summary, handed to the callbacks' ``on_run_end`` first."""
        result = self.summary()
        self._emit("on_run_end", result, epsilon=lambda: result["epsilon"])
        return result

    def summary(self) -> dict[str, Any]:
        """Return the run's results.json record (``summary.run_summary``)."""
        return run_summary(self)
