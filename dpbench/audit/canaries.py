"""White-box gradient canaries in the real loop (Steinke, Nasr, Jagielski 2023, Sec. 6.2).

Each of m canaries is a "Dirac" gradient: zero except ``canary_norm`` (far above any clip
threshold) on its own coordinate of an extra weight vector that real data never moves
(``CanaryModel``). A canary is
included with probability 1/2 (the secret S_i); an included canary joins each step's Poisson
sample with the run's rate q and its gradient is appended to the per-example gradients *before*
the method combines and clips them, so it passes through exactly the loop's clipping,
sensitivity check, noise and accounting. The auditor's score of canary i is the sum over steps
of the released gradient at its coordinate; the top k+ scores are guessed "included", the bottom
k- "excluded".

``break_mechanism`` (tests only) makes the loop release without noise or without clipping while
still *claiming* the planned epsilon: the audit must then report epsilon_lower > claimed.
The broken mechanisms are wrappers in ``audit/broken.py`` (``noise``: the mechanism class
wrapped; ``clipping``: the canary engine wrapper sums unclipped gradients), marked in the
method's record and in results.json under ``broken_on_purpose``. Nothing is patched at run
time. The
audit is the loop's callback plus an engine wrapper (``CanaryAudit``), built by ``CanaryRun``.

Power: with m canaries and r guesses, the largest epsilon_lower the audit can certify is at
most the bound for r correct guesses (``audit_power``); a mechanism leaking more looks the
same. Poisson sampling leaves an included canary out of every step with probability
p = (1 - q)^T (0.37 after one epoch), and such a canary is indistinguishable from an excluded
one: the stated power (``reachable_power``) is the bound at the number of right guesses a
fully leaking mechanism is expected to make, and the ``auto`` guesses are sized for it (the
included side stops short of the sampled included canaries; the excluded side is dropped in
short runs). The defaults (``auto``) size m from the epsilon the run will claim, so that a
broken mechanism is detectable at that epsilon where any count can (up to about 8 at delta =
1e-5), and every result reports its power.

Under ``privacy.unit=user`` the canaries are canary USERS, each of k =
``privacy.max_examples_per_user`` identical Dirac records, sampled and clipped as the run
treats a user, so that including or excluding one is exactly the user-level neighbouring
relation the accountant bounds: under ULS the user joins a step with the user rate and its
k records' sum is clipped once (its coordinate moves by C); under ELS each of its k records
joins with the example rate on its own and is clipped as an example, so a step moves its
coordinate by J C with J ~ Binomial(k, q): the mixture of Gaussians the ELS accountant
composes. Steinke et al.'s one-run bound needs only that the mechanism is (epsilon,
delta)-DP with respect to each canary's inclusion, independently drawn, which is what the
user-level accounting states for a user of at most k records; so epsilon_lower compares to
the accounted user-level epsilon under both strategies. ``break_mechanism=cap`` (ELS, tests
only) gives every canary user ``CAP_BREAK_FACTOR`` k records while k is accounted.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dpbench.audit.bounds import (
    CANARY_LADDER,
    audit_power,
    audit_power_fdp,
    auto_canaries,
    auto_guess_counts,
    auto_guesses,
    epsilon_lower_bound,
    epsilon_lower_bound_fdp,
    reachable_power,
    unsampled_probability,
)
from dpbench.audit.broken import (
    BREAKS,
    CAP_BREAK_FACTOR,
    broken,
    per_user_clip_broken,
    unclipped_sum,
)
from dpbench.errors import ConfigError
from dpbench.methods.context import Released
from dpbench.privacy import PrivacyAccountant
from dpbench.privacy.plan import PrivacyPlan
from dpbench.training.engine.materialised import clip_materialised
from dpbench.training.engine.per_user import clip_per_user
from dpbench.training.engine.protocol import ClippedSum
from dpbench.training.loop import Callback, LoopView, Trainer, run_plan
from dpbench.training.user_unit import user_setup
from dpbench.utils.seeding import stream_generator

log = logging.getLogger(__name__)
AUTO = "auto"
#: most canaries (and guesses) an audit may set: each is a gradient added at every step
MAX_CANARIES = 1_000_000


@dataclass
class AuditSettings:
    """``conf/audit/*.yaml``; ``auto`` counts are sized from the run's claimed epsilon."""

    canaries: int | str = AUTO
    guesses_included: int | str = AUTO
    guesses_excluded: int | str = AUTO
    confidence: float = 0.95
    canary_norm: float = 1000.0  # in units of privacy.clip_norm: always clipped
    seed: int = 0
    break_mechanism: str = "none"  # TESTS ONLY: none | noise | clipping | cap (ELS)

    def __post_init__(self) -> None:
        for key, low in (("canaries", 2), ("guesses_included", 0), ("guesses_excluded", 0)):
            value = getattr(self, key)
            if value != AUTO and (isinstance(value, bool) or not isinstance(value, int)
                                  or not low <= value <= MAX_CANARIES):
                raise ConfigError(f"audit.{key} must be an integer in [{low}, {MAX_CANARIES}] "
                                  f"or auto (got {value!r})")
        counts = (self.canaries, self.guesses_included, self.guesses_excluded)
        if AUTO not in counts and self.guesses_included + self.guesses_excluded > self.canaries:
            raise ConfigError("audit.guesses_included + audit.guesses_excluded must be between "
                              f"0 and audit.canaries = {self.canaries}")
        if not 0 < self.confidence < 1:
            raise ConfigError(f"audit.confidence must be in (0, 1) (got {self.confidence})")
        if not self.canary_norm > 0:
            raise ConfigError(f"audit.canary_norm must be > 0 (got {self.canary_norm})")
        if self.break_mechanism not in BREAKS:
            raise ConfigError(f"audit.break_mechanism must be one of {', '.join(BREAKS)} "
                              f"(got {self.break_mechanism!r})")

    def sized(self, claimed_epsilon: float, delta: float,
              unsampled: float = 0.0) -> AuditSettings:
        """Return a copy with every ``auto`` count chosen for ``claimed_epsilon`` at ``delta``.

        ``unsampled`` is the probability that an included canary joins no step
        (``unsampled_probability``). Canaries: the fewest that can detect a leak above the
        claim (``auto_canaries``), or, with fixed guesses, the fewest that leave room for them;
        guesses: ``auto_guess_counts`` (the included side stops short of the sampled included
        canaries; the excluded side is sized for the highest reachable power).
        """
        fixed = [g for g in (self.guesses_included, self.guesses_excluded) if g != AUTO]
        m = self.canaries
        if m == AUTO:
            if fixed:
                m = next((c for c in CANARY_LADDER if auto_guesses(c) >= max(fixed)
                          and c >= sum(fixed)), None)
                if m is None:
                    raise ConfigError("audit.canaries=auto cannot hold audit.guesses_* = "
                                      f"{fixed}; set audit.canaries")
            else:
                m = auto_canaries(claimed_epsilon, delta, self.confidence, unsampled)
        k_in, k_out = auto_guess_counts(
            m, delta, self.confidence, unsampled,
            None if self.guesses_included == AUTO else self.guesses_included,
            None if self.guesses_excluded == AUTO else self.guesses_excluded)
        if k_in + k_out > m:
            raise ConfigError(f"audit.guesses_included + audit.guesses_excluded = {k_in + k_out}"
                              f" must be at most audit.canaries = {m}")
        return AuditSettings(m, k_in, k_out, self.confidence, self.canary_norm, self.seed,
                             self.break_mechanism)


def planned_epsilon(plan: PrivacyPlan) -> float:
    """Return the epsilon the run will claim: its target, or the planned steps' epsilon (of
    its unit: a user-level plan's accountant is the user's)."""
    if plan.target_epsilon is not None:
        return float(plan.target_epsilon)
    acc = PrivacyAccountant(plan.accountant, plan.sampling, user=plan.user)
    acc.step(noise_multiplier=plan.noise_multiplier, sample_rate=plan.sample_rate,
             count=plan.total_steps)
    return acc.get_epsilon(plan.delta)


class CanaryModel(nn.Module):
    """The audited model plus one weight per canary that the data never moves.

    The canary weights enter the output multiplied by zero, so every real example's gradient
    on them is exactly 0 and the model computes the same function: a canary's coordinate sees
    only its own clipped gradient, the noise and nothing else (Dirac canaries, SNJ Sec. 6.2).
    """

    def __init__(self, model: nn.Module, canaries: int) -> None:
        super().__init__()
        self.model = model
        self.canary = nn.Linear(1, canaries, bias=False)
        nn.init.zeros_(self.canary.weight)

    def __getattr__(self, name: str) -> Any:
        """Delegate unknown attributes (e.g. a model-side method's switches) to the model."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "model":
                raise
            return getattr(self.model, name)

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = self.model(*args, **kwargs)
        if not isinstance(out, torch.Tensor):
            raise ConfigError("the audit supports models whose output is one tensor")
        touch = self.canary(out.new_ones(out.shape[0], 1)).sum(dim=1) * 0.0
        return out + touch.view(-1, *([1] * (out.dim() - 1)))


class CanaryGradients:
    """Wraps the loop's materialising engine: appends the active canaries' gradient rows.

    The rows join the per-example gradients before they are combined and clipped, so the
    wrapper answers the engine protocol's ``clipped_sum`` with the materialised path of the
    loop itself (``clip_materialised``) over its own ``per_example``.
    """

    def __init__(self, engine: Any, canary_param: int, norm: float,
                 unclipped: bool = False, rows_per_canary: int = 1) -> None:
        if not engine.materialises:
            raise ConfigError("the audit needs per-example gradients: use "
                              "trainer.grad_sample_mode=hooks or functorch")
        self.engine, self.mode, self.params = engine, engine.mode, engine.params
        self.canary_param, self.norm = canary_param, norm
        self.active: list[int] = []  # canaries in this step's sample
        #: TESTS ONLY (``audit.break_mechanism=clipping``): sum the unclipped gradients and
        #: hand the loop's check the factors it asked for (``broken.unclipped_sum``)
        self.unclipped = unclipped
        #: privacy.unit=user (ULS): each canary is a canary USER of k identical Dirac rows,
        #: clipped as one user (its rows' sum); 1: a canary example
        self.rows_per_canary = rows_per_canary

    def clipped_sum(self, loss_fn, batch, points, factors_fn, observe=None) -> ClippedSum:
        clipped_sum = unclipped_sum if self.unclipped else clip_materialised
        return clipped_sum(self.per_example, self.params, self.engine.names, loss_fn, batch,
                           points, factors_fn, observe)

    def clipped_user_sum(self, loss_fn, batch, users, points, factors_fn) -> ClippedSum:
        """ULS: the rows' users, then each active canary user's k rows (ids below every real
        one), clipped per user by the loop's own per-user path (or, broken on purpose,
        ``broken.per_user_clip_broken``)."""
        canary_users = torch.tensor([-1 - c for c in self.active
                                     for _ in range(self.rows_per_canary)],
                                    dtype=users.dtype, device=users.device)
        users = torch.cat([users, canary_users])
        clip = per_user_clip_broken if self.unclipped else clip_per_user
        return clip(self.per_example, self.params, loss_fn, batch, users, points, factors_fn)

    def per_example(self, loss_fn, batch) -> tuple[list[torch.Tensor], torch.Tensor]:
        grads, losses = self.engine.per_example(loss_fn, batch)
        if not self.active:
            return grads, losses
        k = self.rows_per_canary
        rows = [torch.zeros((len(self.active) * k, *p.shape), dtype=g.dtype, device=g.device)
                for p, g in zip(self.params, grads)]
        for row, canary in enumerate(c for c in self.active for _ in range(k)):
            rows[self.canary_param][row].view(-1)[canary] = self.norm
        # a canary row has a finite (zero) loss, so the loop keeps it like a real example
        losses = torch.cat([losses, losses.new_zeros(len(self.active) * k)])
        return [torch.cat([g, r]) for g, r in zip(grads, rows)], losses

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


class CanaryAudit(Callback):
    """The audit as the loop's callback and engine wrapper (no subclass of the loop).

    ``wrap_engine`` puts ``CanaryGradients`` around the checked engine; ``on_step_start``
    samples the included canaries into the step as Poisson sampling would; ``on_release``
    adds the released gradient at each canary's coordinate to its score.
    """

    def __init__(self, audit: AuditSettings, unsampled: float, model: CanaryModel,
                 clip_norm: float, rows_per_canary: int = 1, els_rows: int = 0) -> None:
        self.audit, self.unsampled, self.model = audit, unsampled, model
        self.rows_per_canary = rows_per_canary  # privacy.unit=user (ULS): k, canary users
        #: privacy.unit=user (ELS): the records of each canary user, each sampled on its own
        #: at the example rate and clipped as an example (0: not ELS)
        self.els_rows = els_rows
        self.unclipped = audit.break_mechanism == "clipping"  # TESTS ONLY
        self.canary_norm = audit.canary_norm * clip_norm
        gen = stream_generator(audit.seed, "audit_secrets")  # streams of their own
        self.included = torch.rand(audit.canaries, generator=gen) < 0.5  # the secrets S_i
        #: checkpointed with the loop's streams (``Trainer(streams=...)``)
        self.sampler = stream_generator(audit.seed, "audit_canaries")
        self.scores = torch.zeros(audit.canaries, dtype=torch.float64)
        self.engine: CanaryGradients | None = None

    def wrap_engine(self, engine: Any) -> CanaryGradients:
        weight = self.model.canary.weight
        index = next(i for i, p in enumerate(engine.params) if p is weight)
        self.engine = CanaryGradients(engine, index, self.canary_norm, self.unclipped,
                                      self.rows_per_canary)
        return self.engine

    def on_step_start(self, view: LoopView) -> None:
        if self.els_rows:  # ELS: each of a canary user's records joins with probability q
            draws = torch.rand(len(self.included), self.els_rows, generator=self.sampler)
            counts = (draws < view.plan.sample_rate).sum(dim=1) * self.included
            self.engine.active = [c for c in range(len(counts)) for _ in range(int(counts[c]))]
            return
        b = view.plan.bands  # canaries are sampled like data: cyclic Poisson when b > 1
        sampled = torch.rand(len(self.included), generator=self.sampler) < (
            b * view.plan.sample_rate)
        if b > 1:  # canary i lives in partition i mod b, sampled only on its steps
            sampled &= torch.arange(len(self.included)) % b == view.step % b
        self.engine.active = torch.nonzero(self.included & sampled).flatten().tolist()

    def on_release(self, view: LoopView, released: Released) -> None:
        self.engine.active = []
        grads = released.grads[self.engine.canary_param]
        self.scores += grads.detach().reshape(-1).double().cpu()

    def outcome(self, summary: dict[str, Any], delta: float) -> dict[str, Any]:
        """Return the training summary plus the audit's outcome (guesses, bound, power)."""
        a = self.audit
        order = torch.argsort(self.scores, descending=True)
        guessed_in = order[:a.guesses_included]
        guessed_out = order[len(order) - a.guesses_excluded:]
        correct = int(self.included[guessed_in].sum()) + int((~self.included[guessed_out]).sum())
        guesses = a.guesses_included + a.guesses_excluded
        lower = epsilon_lower_bound(a.canaries, guesses, correct, delta, a.confidence)
        lower_fdp = epsilon_lower_bound_fdp(a.canaries, guesses, correct, delta, a.confidence)
        power = reachable_power(a.canaries, a.guesses_included, a.guesses_excluded, delta,
                                a.confidence, self.unsampled)
        ceiling = audit_power(a.canaries, guesses, delta, a.confidence)
        ceiling_fdp = audit_power_fdp(a.canaries, guesses, delta, a.confidence)
        audit = {"method": "one-run gradient canaries (Steinke, Nasr, Jagielski 2023)",
                 "canaries": a.canaries, "included": int(self.included.sum()),
                 "guesses": guesses, "guesses_included": a.guesses_included,
                 "guesses_excluded": a.guesses_excluded, "correct": correct,
                 "confidence": a.confidence, "canary_norm": a.canary_norm,
                 "break_mechanism": a.break_mechanism, "epsilon_lower": lower,
                 "power": power, "epsilon_claimed": summary["epsilon"],
                 "power_if_every_guess_right": ceiling, "ceiling": ceiling,
                 "epsilon_lower_fdp": lower_fdp, "ceiling_fdp": ceiling_fdp,
                 "fdp_method": "f-DP one-run audit, Gaussian trade-off null (Mahloujifar, "
                               "Melis, Chaudhuri 2024)",
                 "unsampled_probability": self.unsampled,
                 **({"canary_users": {"strategy": "els", "records": self.els_rows,
                                      "sampled": "each record at the example rate"}}
                    if self.els_rows else {})}
        audit["exceeds_claimed"] = [name for name, value in (("epsilon_lower", lower),
                                                             ("epsilon_lower_fdp", lower_fdp))
                                    if value > summary["epsilon"]]
        summary = dict(summary)  # the record's mark (broken.broken) last, as the audit's
        mark = summary.pop("broken_on_purpose", None)
        broken_mark = {"broken_on_purpose": mark} if mark is not None else {}
        return {**summary, "epsilon_claimed": summary["epsilon"], "epsilon_lower": lower,
                "epsilon_lower_fdp": lower_fdp, "audit_power": power,
                "audit_ceiling": ceiling, "audit_ceiling_fdp": ceiling_fdp,
                "privacy_violation": bool(audit["exceeds_claimed"]), "audit": audit,
                **broken_mark}


class CanaryRun:
    """Builds the loop with canaries (``experiment.build_trainer``'s ``make_trainer``).

    The audit is sized from the privacy plan, the model gets its canary weights, the method
    is broken when asked (tests only), and the loop gets the audit as a callback plus an
    engine wrapper. ``outcome(summary)`` adds the audit's outcome to the training summary.
    """

    def __init__(self, audit: AuditSettings) -> None:
        self.settings = audit
        self.canaries: CanaryAudit | None = None
        self.trainer: Trainer | None = None

    def __call__(self, *, method: Any, model: nn.Module, privacy: Any, trainer: Any,
                 data: Any, callbacks: list[Callback] | None = None, **kwargs: Any) -> Trainer:
        user = (user_setup(privacy, trainer, method, data, kwargs["seed"])
                if method.private and privacy.enabled else None)
        els = user is not None and not user.per_user_clipping
        if self.settings.break_mechanism == "cap" and not els:
            raise ConfigError("audit.break_mechanism=cap breaks the per-user cap of ELS: it "
                              "needs privacy.unit=user with privacy.user_strategy=els")
        plan = run_plan(method, privacy, trainer, data, user)  # the Trainer's own plan
        if not plan.private:
            raise ConfigError(f"method {method.name!r} releases without noise (epsilon = "
                              "inf): there is nothing to audit")
        # an included canary that Poisson sampling never puts in a step leaves no trace: the
        # guesses and the stated power account for it (docs/audit-and-hpo.md)
        # (ELS: a canary user of k records, each sampled at q, is missed w.p. (1 - q)^(k T))
        unsampled = unsampled_probability(plan.sample_rate, plan.total_steps
                                          * (user.k if els else 1), plan.bands)
        audit = self.settings.sized(planned_epsilon(plan), plan.delta, unsampled)
        canary_model = CanaryModel(model, audit.canaries)
        rows = (user.k * (CAP_BREAK_FACTOR if audit.break_mechanism == "cap" else 1)
                if els else 0)
        self.canaries = CanaryAudit(audit, unsampled, canary_model, privacy.clip_norm,
                                    user.k if user is not None and not els else 1, rows)
        method = broken(method, audit.break_mechanism)  # TESTS ONLY; "none": itself
        self.trainer = Trainer(
            method=method, model=canary_model, privacy=privacy, data=data,
            # canaries join the one physical batch
            trainer=dataclasses.replace(trainer, max_physical_batch_size=None),
            callbacks=[*(callbacks or []), self.canaries],
            engine_wrapper=self.canaries.wrap_engine, materialise=True,
            streams={"audit_canaries": self.canaries.sampler}, **kwargs)
        return self.trainer

    def outcome(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Return the training ``summary`` (``experiment.run``'s) plus the audit's outcome."""
        return self.canaries.outcome(summary, self.trainer.plan.delta)
