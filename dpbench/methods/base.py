"""The method plugin interface: a method is a mechanism and an update.

The loop (``dpbench.training.loop``) runs the step of docs/adding-a-method.md and calls the
method's hooks; ``DPMethod`` hands each hook to the half it belongs to. Stages that touch raw
data or privacy (per-example gradients, noise, the accountant) belong to the loop and are not
hooks:

====  ==============================  =========  ==============================================
 0    ``configure_model(model)``       method     model-side methods (bounded AdaLN modulation)
 1    ``participation_bands()``        mechanism  Poisson (None) or cyclic Poisson over b fixed
                                                  partitions (BandMF; accounted as amplified)
 2    ``evaluation_points(ctx)``       mechanism  where gradients are taken: [theta] by
                                                  default; IVON a posterior sample; DiSK/FIBER
                                                  theta and theta + gamma d
 4    (loop) u_i = sum_k w_k g_i(pt_k) combined per example *before* clipping
 5    ``clip_factors(norms, ctx)``     mechanism  per-example factors; ``sensitivity(ctx)``
                                                  bounds ||factor_i * u_i|| (checked each step)
 6    ``gradient_noise_multiplier``    mechanism  sigma of the gradient query (adaptive
      ``extra_queries(norms, ctx)``               clipping splits sigma); extra privatised
      ``noise_shaper(info)``                      queries (noisy count); the i.i.d. noise ->
                                                  released noise (BandMF's C^{-1} recursion)
 7    ``postprocess(grads, ctx)``      update     filters, spectral denoising
 8    ``update(grads, ctx)``           update     the optimiser step (SGD/Adam/AdamBC/IVON)
 9    ``after_step(released, ctx)``    update     use of the noisy extra queries (diagnostics)
      ``public_state()``                          what the mechanism may read after the update
 10   ``advance(released)``            mechanism  the moving parameters from released values
                                                  (AdaClip's C_t, DiSK's theta_{t-1}, IVON's
                                                  posterior scale): their only writer
 --   ``evaluate(held_out, model)``   update     extra evaluation (posterior averaging) on the
      ``step_metrics()``                          loop's held-out data only; per-step logs
====  ==============================  =========  ==============================================

The mechanism (``dpbench.methods.mechanism``) is all of a method that can change epsilon;
the update (``dpbench.methods.update``) is post-processing of released values. Methods read
the noise level from ``ctx.noise_std`` (sigma_w = sigma C / B with the *expected* B), never
recompute it.
"""

from __future__ import annotations

from dataclasses import asdict
from types import MappingProxyType
from typing import Any, ClassVar

import torch
from torch import nn

from dpbench.methods.context import HeldOut, Released, RunInfo, StepContext
from dpbench.methods.hooks import PRIVACY_HOOKS, UPDATE_HOOKS, refuse_hooks
from dpbench.methods.mechanism import (
    EvalPoint,
    ExtraQuery,
    Mechanism,
    NoiseShaper,
    gradient_queries,
)
from dpbench.methods.settings import NoSettings, checked_settings
from dpbench.methods.update import (
    MechanismView,
    OptimizerFactory,
    Update,
    mechanism_unchanged,
)

__all__ = ["DPMethod", "EvalPoint", "ExtraQuery", "HeldOut", "Mechanism", "MechanismView",
           "NoiseShaper", "OptimizerFactory", "Released", "RunInfo", "StepContext", "Update",
           "check_pair", "gradient_queries", "mechanism_unchanged"]


def check_pair(cls: type) -> None:
    """Raise ``TypeError`` if a method class defines a hook itself: a method is the pair of its
    ``mechanism_cls`` (every hook that can change epsilon) and its ``update_cls``; a hook
    written on the pair would bypass the half a privacy review reads."""
    refuse_hooks(cls, PRIVACY_HOOKS, "can change epsilon; they belong to the method's "
                 "Mechanism (mechanism_cls), not to the method class")
    refuse_hooks(cls, UPDATE_HOOKS, "post-process the release; they belong to the method's "
                 "Update (update_cls), not to the method class")


class DPMethod:
    """A mechanism (``mechanism_cls``) and an update (``update_cls``); defaults: DP-SGD.

    Settings arrive as keyword arguments from ``conf/method/<name>.yaml``, checked against
    ``settings_cls`` (``self.settings`` is the checked, read-only mapping both halves get);
    the hooks are the halves' own, reached through the pair (``__getattr__``); a subclass
    that defines one is refused (``check_pair``);
    ``optimizer`` is a Hydra ``_partial_`` optimiser factory, the update's.
    """

    name: ClassVar[str] = ""
    #: False for the non-private baseline: no clipping, no noise, epsilon = inf.
    private: ClassVar[bool] = True
    #: task kinds this method supports (None: every task).
    tasks: ClassVar[frozenset[str] | None] = None
    #: the method reads materialised per-example gradients itself (a combination of several
    #: evaluation points does not need them: the loop forms it, under bk and hooks alike).
    needs_per_example_grads: ClassVar[bool] = False
    #: the dataclass of ``method.settings``: keys, types, defaults, range checks (the one source)
    settings_cls: ClassVar[type] = NoSettings
    #: what is released: every hook that can change epsilon
    mechanism_cls: ClassVar[type[Mechanism]] = Mechanism
    #: what is done with the release: post-processing
    update_cls: ClassVar[type[Update]] = Update

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_pair(cls)

    def __init__(self, optimizer: OptimizerFactory | None = None, **settings: Any) -> None:
        self.settings = checked_settings(self.name, self.settings_cls, settings)
        self.mechanism = self.mechanism_cls(self.name, self.settings)
        self.updater = self.update_cls(self.name, self.settings, self.mechanism, optimizer)
        self.info: RunInfo | None = None

    # ---- housekeeping --------------------------------------------------------------------
    @classmethod
    def settings_defaults(cls) -> dict[str, Any]:
        """Return the method's settings and their defaults (``settings_cls``'s fields)."""
        return asdict(cls.settings_cls())

    @property
    def params(self) -> list[nn.Parameter]:
        """The trainable parameters (the same list in both halves)."""
        return self.updater.params

    @params.setter
    def params(self, value: list[nn.Parameter]) -> None:
        self.mechanism.params = self.updater.params = value

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The update's optimiser (None before ``setup``)."""
        return self.updater.optimizer

    @optimizer.setter
    def optimizer(self, value: torch.optim.Optimizer | None) -> None:
        self.updater.optimizer = value

    def configure_model(self, model: nn.Module) -> nn.Module:
        """Return the model to train (stage 0; model-side methods switch options here)."""
        return model

    def validate(self, info: RunInfo) -> None:
        """Raise ``ConfigError`` for settings that cannot run (checked before training)."""
        self.mechanism.validate(info)

    def setup(self, params: list[nn.Parameter], info: RunInfo) -> None:
        """Set up the mechanism, then the update, then bring the mechanism's moving parameters
        to the update's public state (``advance`` with no release)."""
        self.info = info
        self.mechanism.setup(params, info)
        with mechanism_unchanged(self.mechanism, "setup"):
            self.updater.setup(params, info)
        self._resync()

    def _resync(self) -> None:
        """Call the mechanism's ``advance`` with no release: set-up and after a restore."""
        with mechanism_unchanged(self.mechanism, "public_state"):
            public = MappingProxyType(self.updater.public_state())
        self.mechanism.advance(Released(step=None, public=public))

    def gradient_evaluations_per_step(self) -> int:
        """Return how many gradient evaluations a step makes (compute, not privacy)."""
        return self.mechanism.gradient_evaluations_per_step()

    def summary(self) -> dict[str, Any]:
        """Return method facts for results.json: the evaluations per step, then both halves'."""
        return {"gradient_evaluations_per_step": self.gradient_evaluations_per_step(),
                **self.mechanism.summary(), **self.updater.summary()}

    def state_dict(self) -> dict[str, Any]:
        """Return the optimiser's state and, under ``extra``, both halves' state."""
        return {"optimizer": self.optimizer.state_dict() if self.optimizer else None,
                "extra": {**self.mechanism.state_dict(), **self.updater.state_dict()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.optimizer is not None and state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        extra = state.get("extra") or {}
        self.mechanism.load_state_dict(extra)
        with mechanism_unchanged(self.mechanism, "load_state_dict"):
            self.updater.load_state_dict(extra)
        if self.info is not None:  # set up: the restored weights and update state
            self._resync()

    # ---- the hooks: each half's own, reached through the pair (none defined here) --------
    def __getattr__(self, name: str) -> Any:
        """Return the hook ``name`` of the half it belongs to (``methods/hooks.py``)."""
        if name in PRIVACY_HOOKS:
            return getattr(self.__dict__["mechanism"], name)
        if name in UPDATE_HOOKS:
            return getattr(self.__dict__["updater"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
