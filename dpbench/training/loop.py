"""THE loop: Poisson sampling, the method's stages, the Gaussian release, the accountant.

One logical step (docs/privacy.md): sample a Poisson batch -> ``private_release`` (per-example
gradients at the method's evaluation points, combination, clipping, noise, extra queries) ->
ledger + accountant -> ``method.postprocess`` -> ``method.update`` -> ``method.after_step``.
Before the first release (and after a resume) the per-example engine is checked against plain
autograd on a few training examples (``engine_check``); a wrong engine is never released from.
The loop knows neither the task nor the logging sinks; both come in from outside.
"""

from __future__ import annotations

import copy
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from opacus.data_loader import DPDataLoader
from opacus.validators import ModuleValidator
from torch import nn
from torch.utils.data import DataLoader

from dpbench.config.schema import PrivacyConfig, TrainerConfig
from dpbench.data.base import TaskData
from dpbench.errors import ConfigError, PrivacyError, TrainingDiverged
from dpbench.methods.base import DPMethod, RunInfo, StepContext
from dpbench.privacy import (
    PrivacyAccountant,
    PrivacyLedger,
    amplified_equivalent,
    calibrate_noise_multiplier,
    check_accountable,
    combined_noise_multiplier,
)
from dpbench.privacy import default_delta as compute_default_delta
from dpbench.tasks.base import Task
from dpbench.training.checkpoint import (
    CHECKPOINT_NAME,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
    state_bytes,
    state_from_bytes,
)
from dpbench.training.distributed import Collective, shard_loader
from dpbench.training.engine_check import EngineCheck, EngineVerifier
from dpbench.training.engines import CLIPPED_SUM_MODES, build_verified_engine
from dpbench.training.precision import with_precision
from dpbench.training.preemption import Preempted
from dpbench.training.prefix_cache import maybe_cache_prefix
from dpbench.training.sampling import (
    CyclicPoissonSampler,
    cyclic_poisson_loader,
    fixed_partitions,
)
from dpbench.training.step import Release, nonprivate_gradient, private_release
from dpbench.utils.seeding import seed_everything, stream_generator, stream_seed
from dpbench.utils.stats import quantile_summary
from dpbench.utils.tensors import move_to

log = logging.getLogger(__name__)


#: what results.json says about ``private_diagnostics`` (see docs/privacy-unit-and-streams.md)
PRIVATE_DIAGNOSTICS_NOTE = (
    "NOT PRIVATISED: computed on the training data without noise (e.g. per-example gradient "
    "norms). Not covered by epsilon; do not publish. Headline metrics are computed on test "
    "data or from released (noisy) quantities only.")


class Callback:
    """Subscriber to the loop's events (W&B, results store, progress bar)."""

    def on_run_start(self, trainer: Trainer) -> None: ...
    def on_step_end(self, trainer: Trainer, metrics: dict[str, float]) -> None: ...
    def on_epoch_end(self, trainer: Trainer, metrics: dict[str, Any]) -> None: ...
    def on_run_end(self, trainer: Trainer, result: dict[str, Any]) -> None: ...


@dataclass
class PrivacyPlan:
    """The mechanism fixed before training: rate, steps, delta and calibrated sigma."""

    private: bool
    sample_rate: float
    expected_batch_size: float
    steps_per_epoch: int
    total_steps: int
    delta: float | None
    noise_multiplier: float
    accountant: str | None
    target_epsilon: float | None
    bands: int = 1  # cyclic Poisson over b partitions: accounted as DP-SGD at b q, T / b steps


def _finite(*groups: Any) -> bool:
    """Return whether every tensor in ``groups`` (iterables of tensors) is finite."""
    return all(bool(torch.isfinite(t).all()) for group in groups for t in group)


def _device_name(device: torch.device) -> str:
    """Return e.g. ``cpu`` or ``cuda:0 (NVIDIA H200)``."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return str(device)


def resolve_device(name: str, collective: Collective | None = None) -> torch.device:
    """Return the run's device; rank r of a multi-process run on CUDA uses cuda:LOCAL_RANK."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if collective is not None and collective.distributed and name.startswith("cuda"):
        return torch.device("cuda", collective.local_rank)
    return torch.device(name)


def plan_privacy(privacy: PrivacyConfig, trainer: TrainerConfig, dataset_size: int,
                 private: bool, bands: int | None = None) -> PrivacyPlan:
    """Check the data-dependent settings and calibrate sigma; raise ConfigError if impossible.

    ``bands`` = b (cyclic Poisson sampling): sigma is calibrated for the equivalent DP-SGD,
    rate b q and ceil(T / b) steps (``amplified_equivalent``).
    """
    n = dataset_size
    if trainer.batch_size > n:
        raise ConfigError(f"trainer.batch_size must be <= N = {n} training examples "
                          f"(got {trainer.batch_size})")
    q = trainer.batch_size / n
    steps_per_epoch = max(int(1 / q), 1)  # as Opacus's DPDataLoader: int(1 / q) per epoch
    total = trainer.epochs * steps_per_epoch
    b = bands or 1
    if b * q > 1:
        raise ConfigError(f"method.settings.bands * trainer.batch_size must be <= N = {n} "
                          f"(cyclic Poisson samples each of the b partitions at rate b B / N; "
                          f"got bands={b}, batch_size={trainer.batch_size})")
    if b > total:
        raise ConfigError(f"method.settings.bands must be <= the run's {total} steps "
                          f"(got {b}); lower it or train longer")
    rate, steps = amplified_equivalent(q, total, b)
    private = private and privacy.enabled
    if not private:
        return PrivacyPlan(False, q, q * n, steps_per_epoch, total, None, 0.0, None,
                           privacy.target_epsilon, b)
    delta = privacy.delta if privacy.delta is not None else compute_default_delta(n)
    if delta >= 1.0 / n:
        raise ConfigError(f"privacy.delta must be < 1/N = {1.0 / n:.3g} (got {delta:.3g})")
    if privacy.noise_multiplier is not None:
        sigma, accountant, target = float(privacy.noise_multiplier), privacy.accountant, None
        check_accountable(sigma, q, total, delta, accountant)
    else:
        sigma, accountant = calibrate_noise_multiplier(
            privacy.target_epsilon, delta, rate, steps, privacy.accountant)
        target = privacy.target_epsilon
    return PrivacyPlan(True, q, q * n, steps_per_epoch, total, delta, sigma, accountant, target,
                       b)


class Trainer:
    """Runs one method on one task under one privacy plan; resumable from its run dir."""

    #: a subclass that reads per-example gradients itself (the audit) sets this: ``auto``
    #: then materialises them (Opacus hooks) instead of book-keeping's clipped sums
    needs_per_example_grads = False

    def __init__(self, *, method: DPMethod, model: nn.Module, task: Task, data: TaskData,
                 privacy: PrivacyConfig, trainer: TrainerConfig, seed: int,
                 run_dir: str | Path | None = None, callbacks: list[Callback] | None = None,
                 fingerprint: str = "", check_sensitivity: bool = True,
                 collective: Collective | None = None) -> None:
        self.method, self.task, self.data = method, task, data
        self.float_task = task  # the per-run engine check's float32 forward
        self.collective = collective or Collective()  # 1 process unless torchrun (distributed.py)
        self.check_sensitivity = check_sensitivity  # False: the audit's broken mechanism only
        self.settings, self.seed = trainer, seed
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.callbacks = callbacks or []
        self.fingerprint = fingerprint
        self.device = resolve_device(trainer.device, self.collective)
        self.plan = plan_privacy(privacy, trainer, len(data.train), method.private,
                                 method.participation_bands())
        if method.tasks is not None and data.task not in method.tasks:
            raise ConfigError(f"method {method.name!r} does not support the {data.task!r} task "
                              f"of dataset {data.name!r} (it supports: "
                              f"{', '.join(sorted(method.tasks))})")
        if self.plan.private and method.needs_per_example_grads and \
                trainer.grad_sample_mode in CLIPPED_SUM_MODES:
            raise ConfigError(f"method {method.name!r} combines per-example gradients and "
                              "needs them materialised: use trainer.grad_sample_mode=hooks "
                              f"or functorch, not {trainer.grad_sample_mode}")
        if trainer.precision != "32-true" and trainer.grad_sample_mode == "ghost":
            raise ConfigError(f"trainer.precision={trainer.precision} needs an engine that "
                              "hands its per-example quantities over in float32 (bk, hooks, "
                              "functorch or auto), not trainer.grad_sample_mode=ghost")
        seed_everything(seed, "model_configure")
        model = method.configure_model(model)
        model, self.data = maybe_cache_prefix(model, data, self.device,
                                              trainer.cache_frozen_prefix,
                                              trainer.eval_batch_size)
        if self.plan.private:
            errors = ModuleValidator.validate(model, strict=False)
            if errors:
                raise ConfigError("model is not DP-compatible (Opacus ModuleValidator): "
                                  + "; ".join(str(e) for e in errors)
                                  + ". Use GroupNorm instead of BatchNorm.")
        self.model = model.to(self.device)  # before Opacus hooks (peft/Opacus issue #820)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.engine_checks: list[dict[str, Any]] = []  # the per-run checks (initial, resumes)
        self.engine_rejected: list[dict[str, Any]] = []  # engines auto tried and rejected
        self.grad_sample_mode = self.engine = None
        if self.plan.private:  # the engine is chosen and checked before any release
            self.engine, check, self.engine_rejected = build_verified_engine(
                trainer.grad_sample_mode, self.model, method, task, self._verifier(),
                self.needs_per_example_grads)
            self.grad_sample_mode = self.engine.mode
            self._record_check(check, "start", step=0)
        self.info = RunInfo(
            dataset_size=len(data.train), expected_batch_size=self.plan.expected_batch_size,
            sample_rate=self.plan.sample_rate, total_steps=self.plan.total_steps,
            noise_multiplier=self.plan.noise_multiplier, clip_norm=privacy.clip_norm,
            private=self.plan.private, task=data.task, device=self.device)
        method.validate(self.info)
        method.setup(self.params, self.info)
        self.noise_shaper = method.noise_shaper(self.info) if self.plan.private else None
        self.clip_norm = privacy.clip_norm
        self.accountant = PrivacyAccountant(self.plan.accountant) if self.plan.private else None
        self.ledger = PrivacyLedger()
        # one spawned seed per stream (dpbench/utils/seeding.py); all are checkpointed
        self.generators: dict[str, torch.Generator] = {
            "sampler": stream_generator(seed, "sampler"),
            "noise": stream_generator(seed, "noise", self.device),
            "method": stream_generator(seed, "method", self.device),
            "task": stream_generator(seed, "task"),
        }
        self.sampler_generator = self.generators["sampler"]
        self.noise_generator = self.generators["noise"]
        if self.collective.distributed:  # each rank's examples get draws of their own
            self.generators["task"] = stream_generator(seed, "task_rank", "cpu",
                                                       self.collective.rank)
        task.generator = self.generators["task"]
        self.task = with_precision(task, trainer.precision, self.device)  # forward only
        seed_everything(seed, "global")  # what still draws from torch's global RNG (dropout)
        self.cyclic_sampler: CyclicPoissonSampler | None = None
        if method.participation_bands() is not None:  # b fixed partitions, one per step
            self.cyclic_sampler = CyclicPoissonSampler(
                fixed_partitions(len(self.data.train), self.plan.bands,
                                 stream_seed(seed, "partitions")),
                self.plan.bands * self.plan.sample_rate, self.plan.steps_per_epoch,
                self.sampler_generator)
            self.train_loader = cyclic_poisson_loader(self.data.train, self.cyclic_sampler)
        else:
            self.train_loader = DPDataLoader(self.data.train, sample_rate=self.plan.sample_rate,
                                             generator=self.sampler_generator)
        # K processes: the global Poisson mask, each rank its slice (distributed.py)
        self.train_loader = shard_loader(self.train_loader, self.collective)
        self.devices = self.collective.gather_strings(_device_name(self.device))
        self.test_loader = DataLoader(self.data.test, batch_size=trainer.eval_batch_size)
        self.step = 0
        self.epoch = 0
        self.epoch_step = 0  # steps done in the current epoch (a preempted run stops mid-epoch)
        self.history: list[dict[str, Any]] = []
        self.step_history: list[dict[str, Any]] = []  # evaluations every eval_every_steps
        self.private_history: list[dict[str, Any]] = []  # un-privatised task diagnostics
        self.wall_time_s = 0.0
        self.skipped_steps = 0
        self._resume_checked = self._resumed = self._resume_verified = False

    # ---- the per-run engine check ----------------------------------------------------------
    def _verifier(self) -> EngineVerifier:
        """Return the per-run check on the first training examples (engine_check).

        Its draws come from a stream of its own; the run's streams and torch's global RNG are
        restored afterwards, so the run's results are those it would have without the check.
        """
        return EngineVerifier(self.model, self.float_task.per_example_loss, self.data.train,
                              self.device, task=self.float_task,
                              generator=stream_generator(self.seed, "engine_check"))

    def _record_check(self, check: EngineCheck, when: str, step: int) -> None:
        if not check.passed:
            raise ConfigError(f"the per-run engine check failed ({when}), refusing to release: "
                              f"{check.line()}")
        self.engine_checks.append({"when": when, "step": step, "engine": check.engine,
                                   "examples": check.examples, "tolerance": check.tolerance,
                                   "worst_error": check.worst_error,
                                   "seconds": round(check.seconds, 4)})

    def engine_check_record(self) -> dict[str, Any] | None:
        """Return results.json's ``engine_check``: what was verified (no data-derived values:
        the worst errors, computed on training examples, are under ``private_diagnostics``)."""
        if not self.engine_checks:
            return None
        return {"engine": self.grad_sample_mode,
                "verified": "per-example norms, clipped and unclipped sums against plain "
                            "autograd, before the first release and after each resume",
                "examples": self.engine_checks[-1]["examples"],
                "tolerance": self.engine_checks[-1]["tolerance"],
                "checks": [{k: c[k] for k in ("when", "step", "engine", "seconds")}
                           for c in self.engine_checks],
                "rejected": self.engine_rejected}

    # ---- privacy -------------------------------------------------------------------------
    def epsilon(self) -> float:
        if not self.plan.private:
            return math.inf
        return self.accountant.get_epsilon(self.plan.delta)

    def _context(self) -> StepContext:
        return StepContext(
            step=self.step, epoch=self.epoch, private=self.plan.private,
            noise_multiplier=self.plan.noise_multiplier, clip_norm=self.clip_norm,
            expected_batch_size=self.plan.expected_batch_size,
            sample_rate=self.plan.sample_rate, dataset_size=len(self.data.train),
            total_steps=self.plan.total_steps, generator=self.noise_generator,
            method_generator=self.generators["method"])

    def _account(self, release: Release) -> None:
        sigma = combined_noise_multiplier(release.queries)
        if sigma < self.plan.noise_multiplier * (1 - 1e-9):
            raise PrivacyError(f"step {self.step} released noise multiplier {sigma:.6g}, below "
                               f"the calibrated {self.plan.noise_multiplier:.6g}")
        b = self.plan.bands
        if self.step % b:  # cyclic Poisson: b steps are one DP-SGD step at rate b q (BandMF
            return  # Thm 4); it is accounted at the first of them, before it can fail
        rate = b * self.plan.sample_rate
        sigma = self.ledger.record(rate, release.queries)
        self.accountant.step(noise_multiplier=sigma, sample_rate=rate)

    # ---- one step ------------------------------------------------------------------------
    def train_step(self, batch: Any) -> dict[str, Any]:
        ctx = self._context()
        batch = move_to(batch, self.device)
        physical = self.settings.max_physical_batch_size
        if self.plan.private:
            sens = self.method.sensitivity(ctx)
            ctx.noise_std = (self.method.gradient_noise_multiplier(self.plan.noise_multiplier)
                             * sens / self.plan.expected_batch_size)
            release = private_release(self.method, self.engine, self.task, batch, ctx,
                                      self.plan.noise_multiplier, physical, self.noise_shaper,
                                      check_sensitivity=self.check_sensitivity,
                                      collective=self.collective)
            self._account(release)  # the release happened: account before anything can fail
        else:
            release = nonprivate_gradient(self.method, self.model, self.params, self.task,
                                          batch, ctx, physical, collective=self.collective)
        self._apply(release, ctx)
        self.step += 1
        # released values (and their post-processing) at the top level; un-privatised
        # diagnostics of the kept examples (non-finite ones are dropped, see step.py) only
        # under "private": sinks leave them out unless asked (docs/privacy-unit-and-streams.md)
        private = {"batch_size": release.realised_batch,
                   "loss": float(release.losses.mean()) if release.losses.numel() else math.nan}
        if release.norms is not None and release.norms.numel():
            private["clip_fraction"] = release.clipped_fraction
            private.update(quantile_summary("grad_norm", release.norms))
        private.update(self.task.step_metrics())
        return {"step": self.step, **self.method.step_metrics(), "private": private}

    def _apply(self, release: Release, ctx: StepContext) -> None:
        """Post-process and apply the release; skip or stop when it or the update is not finite.

        Only released quantities decide: the noisy gradient and queries, their
        post-processing and the updated parameters (a non-finite *example* never gets here: it
        was dropped before the noise). A skipped update restores the model and method state.
        """
        skip = self.settings.nonfinite == "skip"
        saved = self._snapshot() if skip else None
        ok = _finite(release.grads, release.noisy_extras.values())
        if ok:
            grads = self.method.postprocess(release.grads, ctx)
            ok = _finite(grads)
        if ok:
            self.method.update(grads, ctx)
            self.method.after_step(release.noisy_extras, ctx)
            ok = _finite(self.params)
        if ok:
            return
        if not skip:
            raise TrainingDiverged(
                f"non-finite released gradient or update at step {self.step} (epoch "
                f"{self.epoch}); the last good checkpoint is kept. Lower the learning rate, "
                "or set trainer.nonfinite=skip to skip such updates (they stay accounted)")
        self._restore(saved)
        self.skipped_steps += 1

    def _snapshot(self) -> dict[str, Any]:
        return {"params": [p.detach().clone() for p in self.params],
                "method": copy.deepcopy(self.method.state_dict())}

    def _restore(self, saved: dict[str, Any]) -> None:
        with torch.no_grad():
            for p, v in zip(self.params, saved["params"]):
                p.copy_(v)
        self.method.load_state_dict(saved["method"])

    # ---- epochs, evaluation, checkpoints -------------------------------------------------
    def evaluate(self) -> dict[str, Any]:
        return self.method.evaluate(self.task, self.model, self.test_loader, self.device)

    def _collect_diagnostics(self, where: dict[str, int]) -> None:
        """Append the task's un-privatised diagnostics since the last evaluation (if any)."""
        diagnostics = self.task.diagnostics_summary()
        if diagnostics:
            self.private_history.append({**where, **diagnostics})

    def state_dict(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint, "epoch": self.epoch, "step": self.step,
            "epoch_step": self.epoch_step,
            "model": self.model.state_dict(), "method": self.method.state_dict(),
            "task": self.task.state_dict(),
            "accountant": self.accountant.state_dict() if self.accountant else None,
            "ledger": self.ledger.state_dict(), "history": self.history,
            "step_history": self.step_history, "private_history": self.private_history,
            "generators": {name: g.get_state() for name, g in self.generators.items()},
            "rng": rng_state(),
            "wall_time_s": self.wall_time_s, "skipped_steps": self.skipped_steps,
            "noise_multiplier": self.plan.noise_multiplier,
            "sampler": self.cyclic_sampler.state_dict() if self.cyclic_sampler else None,
            "noise_shaper": self.noise_shaper.state_dict() if self.noise_shaper else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("fingerprint") != self.fingerprint:
            raise ConfigError("the checkpoint in this run directory was written by another "
                              "configuration; resume with the same settings or use a new "
                              "hydra.run.dir")
        self.model.load_state_dict(state["model"])
        self.method.load_state_dict(state["method"])
        self.task.load_state_dict(state.get("task") or {})
        if self.accountant is not None:
            self.accountant.load_state_dict(state["accountant"])
        self.ledger.load_state_dict(state["ledger"])
        self.history = list(state["history"])
        self.step_history = list(state.get("step_history", []))
        self.private_history = list(state.get("private_history", []))
        if "generators" not in state:
            raise ConfigError("the checkpoint in this run directory predates per-stream seeds "
                              "and cannot be resumed exactly; start a new hydra.run.dir")
        for name, saved in state["generators"].items():
            generator = self.generators[name]
            generator.set_state(saved.to(generator.get_state().device))
        set_rng_state(state["rng"])
        if self.cyclic_sampler is not None:
            self.cyclic_sampler.load_state_dict(state["sampler"])
        if self.noise_shaper is not None:
            self.noise_shaper.load_state_dict(state["noise_shaper"], self.device)
        self.epoch, self.step = state["epoch"], state["step"]
        self.epoch_step = int(state.get("epoch_step", 0))
        self.wall_time_s, self.skipped_steps = state["wall_time_s"], state["skipped_steps"]

    @property
    def checkpoint_path(self) -> Path | None:
        return self.run_dir / CHECKPOINT_NAME if self.run_dir is not None else None

    def maybe_resume(self) -> bool:
        """Load the run dir's checkpoint when ``trainer.resume``; return whether one was found."""
        if self._resume_checked:  # the CLI resumes at setup, before fit
            return self._resumed
        self._resume_checked = True
        if not self.settings.resume or self.checkpoint_path is None:
            return False
        state = load_checkpoint(self.checkpoint_path)
        if state is None:
            log.info("trainer.resume: no checkpoint in %s; starting fresh", self.run_dir)
            return False
        self.load_state_dict(state)
        self._resumed = True
        log.info("resumed from epoch %d (step %d)", self.epoch, self.step)
        return True

    def _sync_from_main(self) -> None:
        """Start every rank of a K-process run from rank 0's state (a resumed one included).

        Sent as a checkpoint is written and read back without running code (checkpoint.py).
        """
        if not self.collective.distributed:
            return
        data = state_bytes({"resumed": self._resumed, "state": self.state_dict()}) \
            if self.collective.is_main else b""
        received = state_from_bytes(self.collective.bytes_from_main(data))
        if not self.collective.is_main:
            self.load_state_dict(received["state"])
            self._resumed = bool(received["resumed"])

    def _epoch_batches(self) -> Iterator[Any]:
        """Return this epoch's remaining batches (all of them unless resumed mid-epoch).

        Mid-epoch, the sampling stream is put back after the loader's iterator takes its
        per-epoch draw, so the remaining masks are those a run never stopped draws.
        """
        if not self.epoch_step:
            return iter(self.train_loader)
        saved = self.sampler_generator.get_state()
        batches = iter(self.train_loader)
        self.sampler_generator.set_state(saved)
        return itertools.islice(batches, max(self.plan.steps_per_epoch - self.epoch_step, 0))

    def _save_checkpoint(self) -> None:
        if self.settings.checkpoint and self.checkpoint_path is not None:
            save_checkpoint(self.checkpoint_path, self.state_dict())

    def fit(self, stop: Callable[[], bool] | None = None) -> dict[str, Any]:
        """Train for the planned epochs (continuing a resumed run); return the run summary.

        ``stop`` (e.g. ``PreemptionWatch.requested``) is polled after every whole step; when
        it holds on any rank, the run checkpoints that step and raises ``Preempted``.
        """
        self.maybe_resume()
        self._sync_from_main()
        if self._resumed and self.plan.private and not self._resume_verified:
            # the resumed weights and this process's engine: checked again before releasing
            self._record_check(self._verifier().check(self.engine), "resume", step=self.step)
            self._resume_verified = True
        for cb in self.callbacks:
            cb.on_run_start(self)
        self.model.train()
        while self.epoch < self.settings.epochs:
            start = time.perf_counter()
            for batch in self._epoch_batches():
                metrics = self.train_step(batch)
                self.epoch_step += 1
                for cb in self.callbacks:
                    cb.on_step_end(self, metrics)
                every = self.settings.eval_every_steps
                if every and self.step % every == 0:
                    self.step_history.append({"step": self.step, "epsilon": self.epsilon(),
                                              **self.evaluate()})
                    self._collect_diagnostics({"step": self.step})
                if stop is not None and self.collective.any(stop(), self.device):
                    self.wall_time_s += time.perf_counter() - start
                    self._save_checkpoint()
                    raise Preempted(f"preempted at step {self.step} (epoch {self.epoch}); "
                                    "its checkpoint is saved: run again with "
                                    "trainer.resume=true to continue")
            self.epoch += 1
            self.epoch_step = 0
            self.wall_time_s += time.perf_counter() - start
            last = self.epoch == self.settings.epochs
            row: dict[str, Any] = {"epoch": self.epoch, "step": self.step,
                                   "epsilon": self.epsilon()}
            if last or self.epoch % self.settings.eval_every == 0:
                row.update(self.evaluate())
                self._collect_diagnostics({"epoch": self.epoch, "step": self.step})
            self.history.append(row)
            self._save_checkpoint()
            for cb in self.callbacks:
                cb.on_epoch_end(self, row)
        result = self.summary()
        for cb in self.callbacks:
            cb.on_run_end(self, result)
        return result

    def private_diagnostics(self) -> dict[str, Any]:
        """Return the un-privatised training diagnostics, apart from the headline metrics."""
        final = self.private_history[-1] if self.private_history else {}
        out = {"note": PRIVATE_DIAGNOSTICS_NOTE,
               "final": {k: v for k, v in final.items() if k not in ("epoch", "step")},
               "history": self.private_history}
        if self.engine_checks:  # the per-run check's worst relative error, on training rows
            out["engine_check"] = [{k: c[k] for k in ("when", "step", "worst_error")}
                                   for c in self.engine_checks]
        return out

    def summary(self) -> dict[str, Any]:
        """Return the run's privacy facts, final metrics and history."""
        final = self.history[-1] if self.history else {}
        metrics = {k: v for k, v in final.items() if k not in ("epoch", "step", "epsilon")}
        return {
            "private": self.plan.private,
            "target_epsilon": self.plan.target_epsilon,
            "epsilon": self.epsilon(),
            "delta": self.plan.delta,
            "noise_multiplier": self.plan.noise_multiplier,
            "sample_rate": self.plan.sample_rate,
            "participation_bands": self.plan.bands,  # accounted at rate b q, ceil(T / b) steps
            "expected_batch_size": self.plan.expected_batch_size,
            "steps": self.step,
            "planned_steps": self.plan.total_steps,
            "skipped_steps": self.skipped_steps,
            "accountant": self.accountant.mechanism if self.accountant else None,
            "clip_norm": self.clip_norm if self.plan.private else None,
            "grad_sample_mode": self.grad_sample_mode,
            "dataset_size": len(self.data.train),
            # what one "example" of epsilon protects (time series: window or observation)
            "privacy_unit": self.data.extras.get("privacy_unit", "example"),
            "metrics": metrics,
            "history": self.history,
            "step_history": self.step_history,
            "private_diagnostics": self.private_diagnostics(),
            "privacy_ledger": self.ledger.to_json(),
            "method_summary": self.method.summary(),
            "wall_time_s": self.wall_time_s,
            # how it ran: K processes (one mask, noise once: distributed.py), the forward's
            # precision (the mechanism is float32 either way) and each rank's device
            "world_size": self.collective.world_size,
            "precision": self.settings.precision,
            "devices": self.devices,
            "data_notes": list(self.data.notes),
            # private runs: what the per-run check verified (engine_check_record)
            **({"engine_check": self.engine_check_record()} if self.engine_checks else {}),
        }
