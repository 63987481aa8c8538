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
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dpbench.audit.bounds import epsilon_lower_bound
from dpbench.errors import ConfigError
from dpbench.privacy.ledger import Query
from dpbench.training import step as step_module
from dpbench.training.loop import Trainer
from dpbench.training.step import Release
from dpbench.utils.seeding import stream_generator

log = logging.getLogger(__name__)
BREAKS = ("none", "noise", "clipping")


@dataclass
class AuditSettings:
    """``conf/audit/*.yaml``."""

    canaries: int = 1000
    guesses_included: int = 100
    guesses_excluded: int = 100
    confidence: float = 0.95
    canary_norm: float = 1000.0  # in units of privacy.clip_norm: always clipped
    seed: int = 0
    break_mechanism: str = "none"  # TESTS ONLY: none | noise | clipping

    def __post_init__(self) -> None:
        if self.canaries < 2:
            raise ConfigError(f"audit.canaries must be >= 2 (got {self.canaries})")
        if min(self.guesses_included, self.guesses_excluded) < 0 or (
                self.guesses_included + self.guesses_excluded > self.canaries):
            raise ConfigError("audit.guesses_included + audit.guesses_excluded must be between "
                              f"0 and audit.canaries = {self.canaries}")
        if not 0 < self.confidence < 1:
            raise ConfigError(f"audit.confidence must be in (0, 1) (got {self.confidence})")
        if not self.canary_norm > 0:
            raise ConfigError(f"audit.canary_norm must be > 0 (got {self.canary_norm})")
        if self.break_mechanism not in BREAKS:
            raise ConfigError(f"audit.break_mechanism must be one of {', '.join(BREAKS)} "
                              f"(got {self.break_mechanism!r})")


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
    """Wraps the loop's per-example engine: appends the active canaries' gradient rows."""

    def __init__(self, engine: Any, canary_param: int, norm: float) -> None:
        self.engine, self.mode, self.params = engine, engine.mode, engine.params
        self.canary_param, self.norm = canary_param, norm
        self.active: list[int] = []  # canaries in this step's sample

    def per_example(self, loss_fn, batch) -> tuple[list[torch.Tensor], torch.Tensor]:
        grads, losses = self.engine.per_example(loss_fn, batch)
        if not self.active:
            return grads, losses
        rows = [torch.zeros((len(self.active), *p.shape), dtype=g.dtype, device=g.device)
                for p, g in zip(self.params, grads)]
        for row, canary in enumerate(self.active):
            rows[self.canary_param][row].view(-1)[canary] = self.norm
        return [torch.cat([g, r]) for g, r in zip(grads, rows)], losses

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


class AuditTrainer(Trainer):
    """The training loop with gradient canaries and per-canary scores of the releases."""

    def __init__(self, *, audit: AuditSettings, model: nn.Module, **kwargs: Any) -> None:
        self.audit = audit
        super().__init__(model=CanaryModel(model, audit.canaries), **kwargs)
        if not self.plan.private:
            raise ConfigError(f"method {self.method.name!r} releases without noise (epsilon = "
                              "inf): there is nothing to audit")
        if self.engine.mode == "ghost":
            raise ConfigError("the audit needs per-example gradients: use "
                              "trainer.grad_sample_mode=hooks or functorch")
        weight = self.model.canary.weight
        index = next(i for i, p in enumerate(self.params) if p is weight)
        self.settings.max_physical_batch_size = None  # canaries join the one physical batch
        gen = stream_generator(audit.seed, "audit_secrets")  # streams of their own
        self.included = torch.rand(audit.canaries, generator=gen) < 0.5  # the secrets S_i
        self.canary_sampler = self.generators["audit_canaries"] = stream_generator(
            audit.seed, "audit_canaries")  # checkpointed with the loop's streams
        self.canary_index = index
        self.scores = torch.zeros(audit.canaries, dtype=torch.float64)
        self.engine = CanaryGradients(self.engine, index, audit.canary_norm * self.clip_norm)
        if audit.break_mechanism == "noise":
            self.method.gradient_noise_multiplier = lambda sigma: 0.0  # type: ignore[method-assign]
        elif audit.break_mechanism == "clipping":
            self.method.clip_factors = (  # type: ignore[method-assign]
                lambda norms, ctx: torch.ones_like(norms))

    def train_step(self, batch: Any) -> dict[str, float]:
        b = self.plan.bands  # canaries are sampled like data: cyclic Poisson when b > 1
        sampled = torch.rand(len(self.included), generator=self.canary_sampler) < (
            b * self.plan.sample_rate)
        if b > 1:  # canary i lives in partition i mod b, sampled only on its steps
            sampled &= torch.arange(len(self.included)) % b == self.step % b
        self.engine.active = torch.nonzero(self.included & sampled).flatten().tolist()
        try:
            return super().train_step(batch)
        finally:
            self.engine.active = []

    def _account(self, release: Release) -> None:
        if self.audit.break_mechanism == "none":
            super()._account(release)
        else:  # the broken loop still claims the planned mechanism
            sigma = self.plan.noise_multiplier
            self.ledger.record(self.plan.sample_rate, [Query("gradient", 1.0, sigma)])
            self.accountant.step(noise_multiplier=sigma, sample_rate=self.plan.sample_rate)
        self.scores += release.grads[self.canary_index].detach().reshape(-1).double().cpu()

    @contextlib.contextmanager
    def _broken_checks(self) -> Iterator[None]:
        """Switch off the loop's sensitivity check while clipping is deliberately broken."""
        if self.audit.break_mechanism != "clipping":
            yield
            return
        saved = step_module._check_bound
        step_module._check_bound = lambda *args, **kwargs: None
        try:
            yield
        finally:
            step_module._check_bound = saved

    def run_audit(self) -> dict[str, Any]:
        """Train with canaries; return the training summary plus the audit's outcome."""
        with self._broken_checks():
            summary = self.fit()
        a = self.audit
        order = torch.argsort(self.scores, descending=True)
        guessed_in = order[:a.guesses_included]
        guessed_out = order[len(order) - a.guesses_excluded:]
        correct = int(self.included[guessed_in].sum()) + int((~self.included[guessed_out]).sum())
        guesses = a.guesses_included + a.guesses_excluded
        lower = epsilon_lower_bound(a.canaries, guesses, correct, self.plan.delta, a.confidence)
        audit = {"method": "one-run gradient canaries (Steinke, Nasr, Jagielski 2023)",
                 "canaries": a.canaries, "included": int(self.included.sum()),
                 "guesses": guesses, "correct": correct, "confidence": a.confidence,
                 "canary_norm": a.canary_norm, "break_mechanism": a.break_mechanism,
                 "epsilon_lower": lower, "epsilon_claimed": summary["epsilon"]}
        return {**summary, "epsilon_claimed": summary["epsilon"], "epsilon_lower": lower,
                "audit": audit}
