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
from dpbench.training.checkpoint import (
    CHECKPOINT_NAME,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
    state_bytes,
    state_from_bytes,
)

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
        "model": trainer.model.state_dict(), "method": trainer.method.state_dict(),
        "task": trainer.task.state_dict(),
        "accountant": trainer.accountant.state_dict() if trainer.accountant else None,
        "ledger": trainer.ledger.state_dict(),
        "generators": {name: g.get_state() for name, g in trainer.generators.items()},
        "rng": rng_state(),
        "noise_multiplier": trainer.plan.noise_multiplier,
        "sampler": trainer.batch_sampler.state_dict() if trainer.batch_sampler else None,
        "noise_shaper": trainer.noise_shaper.state_dict() if trainer.noise_shaper else None,
    }


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
    trainer.method.load_state_dict(state["method"])
    trainer.task.load_state_dict(state.get("task") or {})
    if trainer.accountant is not None:
        trainer.accountant.load_state_dict(state["accountant"])
    trainer.ledger.load_state_dict(state["ledger"])
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
        state = load_checkpoint(self.path)
        if state is None:
            log.info("trainer.resume: no checkpoint in %s; starting fresh", self.path.parent)
        return state


def state_from_main(collective: Any, state: Callable[[], dict[str, Any]]
                    ) -> dict[str, Any] | None:
    """Return rank 0's ``state()`` on every other rank of a K-process run (None on rank 0 and
    in one process), sent as a checkpoint is written and read back without running code."""
    if not collective.distributed:
        return None
    data = state_bytes(state()) if collective.is_main else b""
    received = state_from_bytes(collective.bytes_from_main(data))
    return None if collective.is_main else received
