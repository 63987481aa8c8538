"""What a checkpoint holds of a run, and how a run is put back from it.

Everything a resumed run needs to continue exactly as if it had never stopped: the model,
the method (optimiser, filters, thresholds), the task's state, the accountant and the ledger
(the same accountant continues), every random stream and torch's global RNG, the cyclic
sampler and the noise shaper, and the run's progress and histories. The fingerprint of the
configuration refuses a checkpoint written by another one (docs/reliability.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpbench.errors import ConfigError
from dpbench.privacy.record_check import LedgerMismatch, check_ledger, ledger_history
from dpbench.training.checkpoint import (
    CHECKPOINT_NAME,
    load_checkpoint_bytes,
    read_checkpoint_bytes,
    rng_state,
    save_checkpoint,
    set_rng_state,
    state_bytes,
    state_from_bytes,
)
from dpbench.utils.mac import verify_mac

log = logging.getLogger(__name__)

#: the run's progress counters and histories, saved and restored as they are
PROGRESS = ("epoch", "step", "epoch_step", "history", "step_history",
            "unprivatised_history", "wall_time_s", "skipped_steps")
#: names an older checkpoint used for a progress entry
OLD_NAMES = {"unprivatised_history": "private_history"}


def run_state(trainer: Any) -> dict[str, Any]:
    """Return ``trainer``'s checkpoint (``checkpoint.save_checkpoint`` writes it)."""
    return {
        "fingerprint": trainer.fingerprint,
        **{name: getattr(trainer, name) for name in PROGRESS},
        "model": trainer.model.state_dict(), "method": trainer.halves.state_dict(),
        "task": trainer.task.state_dict(),
        "accountant": trainer.accountant.state_dict() if trainer.accountant else None,
        "ledger": trainer.ledger.state_dict(),
        "generators": {name: g.get_state() for name, g in trainer.generators.items()},
        "rng": rng_state(),
        "noise_multiplier": trainer.plan.noise_multiplier,
        "sampler": trainer.batch_sampler.state_dict() if trainer.batch_sampler else None,
        "noise_shaper": trainer.noise_shaper.state_dict() if trainer.noise_shaper else None,
    }


def _progress(state: dict[str, Any], plan: Any, epochs: int) -> int:
    """Return the checkpoint's step counter if it agrees with its epoch and epoch step."""
    step, epoch, within = (state.get(k) for k in ("step", "epoch", "epoch_step"))
    within = 0 if within is None else within
    numbers = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                  for v in (step, epoch, within))
    if not (numbers and epoch <= epochs and within <= plan.steps_per_epoch
            and step == epoch * plan.steps_per_epoch + within):
        raise ConfigError(f"the checkpoint's step counter (step {step!r}, epoch {epoch!r}, "
                          f"epoch step {within!r}) does not match this run's plan "
                          f"({plan.steps_per_epoch} steps per epoch, {epochs} epochs); move "
                          "checkpoint.pt away to start afresh")
    return step


def restore_privacy_state(trainer: Any, state: dict[str, Any]) -> None:
    """Re-derive the ledger and the accountant from the run's plan and the step counter.

    Neither is loaded as written: the checkpoint's ledger is accepted only if it is exactly
    the plan's mechanism (rate b q, the calibrated sigma) for the steps its counter says ran
    (``privacy.record_check.check_ledger``), and the accountant's history is rebuilt from it, so an
    emptied ledger, a raised sigma or a moved counter is refused (docs/reliability-bad-input.md).
    """
    plan = trainer.plan
    step = _progress(state, plan, trainer.settings.epochs)
    entries = (state.get("ledger") or {}).get("entries") if isinstance(
        state.get("ledger"), dict) else None
    try:
        if plan.private:
            ledger = check_ledger(entries, noise_multiplier=plan.noise_multiplier,
                                  sample_rate=plan.sample_rate, bands=plan.bands, steps=step,
                                  what="the checkpoint's ledger")
        elif entries:
            raise LedgerMismatch("the checkpoint's ledger records releases, but this run's "
                                 "plan is not private")
        else:
            ledger = []
    except LedgerMismatch as err:
        raise ConfigError(f"{err}; move checkpoint.pt away to start afresh") from None
    fields = ("sample_rate", "noise_multiplier", "queries", "steps")
    # the sampler the steps ran under is the plan's, never the file's (Poisson: no field)
    sampling = plan.sampling.ledger_spec()
    trainer.ledger.load_state_dict({"entries": [
        {**{k: e[k] for k in fields}, **({"sampling": sampling} if sampling else {})}
        for e in ledger]})
    if trainer.accountant is not None:
        trainer.accountant.load_state_dict({"mechanism": trainer.accountant.mechanism,
                                            "history": ledger_history(ledger),
                                            "sampling": trainer.accountant.sampling.to_json()})


def restore_run_state(trainer: Any, state: dict[str, Any]) -> None:
    """Put ``trainer`` back to ``state``; refuse a checkpoint of another configuration."""
    if state.get("fingerprint") != trainer.fingerprint:
        raise ConfigError("the checkpoint in this run directory was written by another "
                          "configuration; resume with the same settings or use a new "
                          "hydra.run.dir")
    if "generators" not in state:
        raise ConfigError("the checkpoint in this run directory predates per-stream seeds "
                          "and cannot be resumed exactly; start a new hydra.run.dir")
    trainer.model.load_state_dict(state["model"])
    trainer.halves.load_state_dict(state["method"])
    trainer.task.load_state_dict(state.get("task") or {})
    restore_privacy_state(trainer, state)
    for name, saved in state["generators"].items():
        generator = trainer.generators[name]
        generator.set_state(saved.to(generator.get_state().device))
    set_rng_state(state["rng"])
    if trainer.batch_sampler is not None:
        trainer.batch_sampler.load_state_dict(state["sampler"])
    if trainer.noise_shaper is not None:
        trainer.noise_shaper.load_state_dict(state["noise_shaper"], trainer.device)
    defaults = {"epoch_step": 0, "step_history": [], "unprivatised_history": []}
    for name in PROGRESS:
        value = (state.get(name, state.get(OLD_NAMES.get(name, name), defaults[name]))
                 if name in defaults else state[name])
        setattr(trainer, name, list(value) if isinstance(value, list) else value)
    trainer.epoch_step = int(trainer.epoch_step)


class RunCheckpoint:
    """A run directory's checkpoint: written after each epoch (and when preempted), read back
    for ``trainer.resume``; ``trainer.checkpoint=false`` writes none."""

    def __init__(self, run_dir: Path | None, settings: Any) -> None:
        self.path = run_dir / CHECKPOINT_NAME if run_dir is not None else None
        self.write, self.resume = settings.checkpoint, settings.resume
        self.looked = self.resumed = False  # whether a resume was tried, and succeeded

    def resume_into(self, trainer: Any) -> bool:
        """Put ``trainer`` back to the checkpoint once (when ``trainer.resume``); return
        whether it was."""
        if not self.looked:
            self.looked, state = True, self.load()
            if state is not None:
                restore_run_state(trainer, state)
                self.resumed = True
                log.info("resumed from epoch %d (step %d)", trainer.epoch, trainer.step)
        return self.resumed

    def sync_from_main(self, trainer: Any) -> None:
        """Start every rank of a K-process run from rank 0's state (a resumed one included)."""
        received = state_from_main(trainer.collective, lambda: {
            "resumed": self.resumed, "state": run_state(trainer)})
        if received is not None:
            if received["state"].get("fingerprint") != trainer.fingerprint:
                raise ConfigError(
                    "this rank composed another configuration than rank 0 (a setting differs "
                    "between the ranks, e.g. one read from the environment); every rank must "
                    "run the same settings")
            restore_run_state(trainer, received["state"])
            self.resumed = bool(received["resumed"])

    def save(self, trainer: Any) -> None:
        if self.write and self.path is not None:
            save_checkpoint(self.path, run_state(trainer))

    def load(self) -> dict[str, Any] | None:
        """Return the checkpoint to resume from, or None (no resume asked, or none written)."""
        if not self.resume or self.path is None:
            return None
        data = read_checkpoint_bytes(self.path)
        if data is None:
            log.info("trainer.resume: no checkpoint in %s; starting fresh", self.path.parent)
            return None
        verify_mac(self.path, data, "the checkpoint")  # before a byte of it is parsed
        return load_checkpoint_bytes(data, self.path)


def state_from_main(collective: Any, state: Callable[[], dict[str, Any]]
                    ) -> dict[str, Any] | None:
    """Return rank 0's ``state()`` on every other rank of a K-process run (None on rank 0 and
    in one process), sent as a checkpoint is written and read back without running code."""
    if not collective.distributed:
        return None
    data = state_bytes(state()) if collective.is_main else b""
    received = state_from_bytes(collective.bytes_from_main(data))
    return None if collective.is_main else received
