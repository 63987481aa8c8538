"""The schema of ``results.json``: what one run records, from the trainer's public state.

The sinks (``dpbench.logging``) write it; the readers (``dpbench.analysis``) read it. Headline
metrics come from test data or released (noisy) values only; what is computed on training
data without noise sits under ``unprivatised_diagnostics`` with a note saying so
(docs/privacy-unit-and-streams.md). Files written before that name read their
``private_diagnostics`` the same way.
"""

from __future__ import annotations

from typing import Any

from dpbench.privacy.gap import gap_record
from dpbench.privacy.ledger import run_event, to_json
from dpbench.privacy.record_check import ledger_history
from dpbench.privacy.samplers import convention
from dpbench.privacy.user_level import user_convention, user_dp_event

#: what results.json says about ``unprivatised_diagnostics`` (see docs/privacy-unit-and-streams.md)
UNPRIVATISED_DIAGNOSTICS_NOTE = (
    "NOT PRIVATISED: computed on the training data without noise (e.g. per-example gradient "
    "norms). Not covered by epsilon; do not publish. Headline metrics are computed on test "
    "data or from released (noisy) quantities only.")



def engine_check_record(trainer: Any) -> dict[str, Any] | None:
    """Return results.json's ``engine_check``: what was verified (no data-derived values:
    the worst errors, computed on training examples, are under ``unprivatised_diagnostics``)."""
    checks = trainer.engine_checks
    if not checks:
        return None
    return {"engine": trainer.grad_sample_mode,
            "verified": "per-example norms, clipped and unclipped sums"
                        + (" and per-user norms and clipped sums"
                           if getattr(trainer.engine, "per_user", False) else "")
                        + " against plain autograd, before the first release and after "
                          "each resume",
            "examples": checks[-1]["examples"], "tolerance": checks[-1]["tolerance"],
            "checks": [{k: c[k] for k in ("when", "step", "engine", "seconds")} for c in checks],
            "rejected": trainer.engine_rejected}


def unprivatised_diagnostics(trainer: Any) -> dict[str, Any]:
    """Return the un-privatised training diagnostics, apart from the headline metrics."""
    history = trainer.unprivatised_history
    final = history[-1] if history else {}
    out = {"note": UNPRIVATISED_DIAGNOSTICS_NOTE,
           "final": {k: v for k, v in final.items() if k not in ("epoch", "step")},
           "history": history}
    if trainer.engine_checks:  # the per-run check's worst relative error, on training rows
        out["engine_check"] = [{k: c[k] for k in ("when", "step", "worst_error")}
                               for c in trainer.engine_checks]
    return out


def mechanism_record(trainer: Any) -> dict[str, Any]:
    """Return results.json's ``mechanism``: how examples were sampled and the run's release as
    a serialised dp-accounting ``DpEvent`` (privacy/ledger.py), re-accounted by
    ``privacy.verify.event_epsilon``."""
    plan = trainer.step_plan
    user = trainer.plan.user
    if user is not None and plan.private:  # privacy.unit=user: the strategy's own event
        event = user_dp_event(user, ledger_history(trainer.ledger.to_json()))
    else:
        event = run_event(trainer.ledger.to_json(), plan.private, plan.sampling)
    return {"sampling": plan.sampling, "bands": plan.bands,
            "neighbouring": trainer.plan.sampling.neighbouring,
            # what the event's multipliers are relative to, and who reads them (C or 2C)
            "convention": (user_convention(user, trainer.plan.sampling.neighbouring)
                           if user is not None else convention(trainer.plan.sampling)),
            "gradient_noise_multiplier": plan.gradient_noise_multiplier,
            "event": to_json(event)}


def user_level_record(trainer: Any) -> dict[str, Any]:
    """Return results.json's ``user_level`` (privacy.unit=user): the strategy, k, the
    partition's public sizes, how the cap chose rows, and what each user's clip bounds."""
    setup = trainer.user
    return {**setup.facts.record(),
            "clipped": "user gradient sum" if setup.per_user_clipping else "example gradient"}


def run_summary(trainer: Any) -> dict[str, Any]:
    """Return the run's privacy facts, final metrics and history (results.json's fields)."""
    plan = trainer.plan
    final = trainer.history[-1] if trainer.history else {}
    metrics = {k: v for k, v in final.items() if k not in ("epoch", "step", "epsilon")}
    return {
        "private": plan.private,
        "target_epsilon": plan.target_epsilon,
        "epsilon": trainer.epsilon(),
        "delta": plan.delta,
        "noise_multiplier": plan.noise_multiplier,
        "sample_rate": plan.sample_rate,
        "participation_bands": plan.bands,  # accounted at rate b q, ceil(T / b) steps
        "expected_batch_size": plan.expected_batch_size,
        "steps": trainer.step,
        "planned_steps": plan.total_steps,
        "skipped_steps": trainer.skipped_steps,
        "accountant": trainer.accountant.mechanism if trainer.accountant else None,
        # privacy.accountant=null: which accountant the run chose for its sampler, and why
        **({"accountant_note": plan.accountant_note} if plan.accountant_note else {}),
        # the batch sampler, its neighbouring relation, and (not Poisson) the gap:
        # epsilon_if_poisson (NOT valid for the run) and a lower bound (privacy/gap.py)
        **(gap_record(plan.sampling, trainer.accountant.mechanism, trainer.accountant.history,
                      plan.delta) if trainer.accountant and trainer.accountant.history else
           {"sampler": plan.sampling.sampler, "neighbouring": plan.sampling.neighbouring}),
        "clip_norm": trainer.clip_norm if plan.private else None,
        "grad_sample_mode": trainer.grad_sample_mode,
        # the units the sampler draws from (privacy.unit=user: U users under uls, the N_k
        # rows kept under the per-user cap under els)
        "dataset_size": getattr(trainer, "units", len(trainer.data.train)),
        # what one "example" of epsilon protects (time series: window or observation), or
        # every record of one user (privacy.unit=user)
        "privacy_unit": ("user" if getattr(trainer, "user", None) is not None
                         else trainer.data.extras.get("privacy_unit", "example")),
        **({"user_level": user_level_record(trainer)}
           if getattr(trainer, "user", None) is not None else {}),
        "metrics": metrics,
        "history": trainer.history,
        "step_history": trainer.step_history,
        "unprivatised_diagnostics": unprivatised_diagnostics(trainer),
        "privacy_ledger": trainer.ledger.to_json(),
        "mechanism": mechanism_record(trainer),
        "method_summary": trainer.halves.summary(),
        "wall_time_s": trainer.wall_time_s,
        # how it ran: K processes (one mask, noise once: distributed.py), the forward's
        # precision (the mechanism is float32 either way) and each rank's device
        "world_size": trainer.collective.world_size,
        "precision": trainer.settings.precision,
        "devices": trainer.devices,
        "data_notes": list(trainer.data.notes),
        # private runs: what the per-run check verified (engine_check_record)
        **({"engine_check": engine_check_record(trainer)} if trainer.engine_checks else {}),
        # TESTS ONLY: a mechanism broken on purpose (audit/broken.py) says so in its record
        **({"broken_on_purpose": trainer.method.broken_on_purpose}
           if trainer.method.broken_on_purpose else {}),
    }
