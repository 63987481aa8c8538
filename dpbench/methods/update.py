"""The update: the half of a method that post-processes what the mechanism released.

Every hook here sees released values only (the noisy gradient, the noisy extra queries, the
step context), so nothing in an update can change epsilon: it is post-processing. The
defaults apply the YAML's optimiser to the released gradient:

================================  =============================================================
``postprocess(grads, ctx)``        filters, denoising of the released gradient: unchanged
``update(grads, ctx)``             the optimiser step on the (post-processed) gradient
``after_step(released, ctx)``      use of the noisy extra queries: nothing
``public_state()``                 what the mechanism's ``advance`` may read: nothing
``evaluation_samples()``           parameter samples to average the prediction over: 0
``evaluation_offsets(i, device)``  sample i's offsets from the weights (IVON's posterior)
``evaluate(held_out)``             the test metrics: the loop's, at the current weights
``step_metrics()``                 per-step diagnostics to log: none
================================  =============================================================

An update holds no reference to its mechanism, to the noise stream or to the data: it is
built from the method's name, its frozen settings and its optimiser factory, and each hook
is handed values (``StepContext``, the released tensors, ``HeldOut``). What it needs of the
mechanism arrives as values too: this step's evaluation points in ``ctx.points``. The
mechanism reads the update only through ``public_state()``, in its ``advance``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from dpbench.methods.context import HeldOut, RunInfo, StepContext
from dpbench.methods.hooks import PRIVACY_HOOKS, UPDATE_HOOKS, refuse_hooks

__all__ = ["UPDATE_HOOKS", "OptimizerFactory", "Update"]

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


def default_optimizer(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """Return SGD with lr 0.1: the optimiser of a method whose YAML names none."""
    return torch.optim.SGD(params, lr=0.1)


class Update:
    """The YAML's optimiser on the released gradient (SGD with lr 0.1 when none is given).

    ``settings`` is the method's frozen settings dataclass, ``name`` the method's (for error
    messages) and ``optimizer`` a Hydra ``_partial_`` factory.
    """

    def __init__(self, name: str, settings: Any,
                 optimizer: OptimizerFactory | None = None) -> None:
        self.name = name
        self.settings = settings
        self.optimizer_factory = optimizer or default_optimizer
        self.params: list[nn.Parameter] = []
        self.optimizer: torch.optim.Optimizer | None = None
        self.info: RunInfo | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        refuse_hooks(cls, PRIVACY_HOOKS, "can change epsilon; they belong to the method's "
                     "Mechanism, not to its Update (the loop never calls them here)")

    # ---- housekeeping --------------------------------------------------------------------
    def setup(self, params: list[nn.Parameter], info: RunInfo) -> None:
        """Build the optimiser and any state over the trainable parameters."""
        self.params = params
        self.info = info
        self.optimizer = self.optimizer_factory(params)

    def summary(self) -> dict[str, Any]:
        """Return facts about the update for results.json."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Return the state a checkpoint keeps beyond the optimiser's (filters, counters)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()``'s entries (``state`` may hold the mechanism's too)."""

    def step_metrics(self) -> dict[str, float]:
        """Return per-step diagnostics to log (e.g. the share of floored second moments)."""
        return {}

    # ---- stage 7: post-processing --------------------------------------------------------
    def postprocess(self, grads: list[torch.Tensor], ctx: StepContext) -> list[torch.Tensor]:
        """Return the gradient the optimiser consumes (the released one by default)."""
        return grads

    # ---- stage 8: the optimiser step -----------------------------------------------------
    def update(self, grads: list[torch.Tensor], ctx: StepContext) -> None:
        """Apply the optimiser to ``grads``."""
        assert self.optimizer is not None
        for p, g in zip(self.params, grads):
            p.grad = g
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    # ---- stage 9 and evaluation ----------------------------------------------------------
    def after_step(self, released: dict[str, torch.Tensor], ctx: StepContext) -> None:
        """Use the step's noisy extra queries (``released``: name -> noisy sum)."""

    def public_state(self) -> dict[str, Any]:
        """Return what the mechanism's ``advance`` may read of the update after its step
        (post-processing of released values, e.g. IVON's posterior scale): nothing here."""
        return {}

    def evaluation_samples(self) -> int:
        """Return S, the parameter samples whose predictions the loop averages for
        ``HeldOut.averaged`` (0: none; IVON's Bayesian model averaging)."""
        return 0

    def evaluation_offsets(self, index: int, device: torch.device) -> list[torch.Tensor]:
        """Return sample ``index``'s offsets from the weights (one tensor per parameter)."""
        raise NotImplementedError(f"{type(self).__name__} draws no evaluation samples")

    def evaluate(self, held_out: HeldOut) -> dict[str, Any]:
        """Return test metrics; default: the task's, at the current weights (``held_out``
        holds values the loop computed: no model, no task, no data)."""
        return dict(held_out.metrics)
