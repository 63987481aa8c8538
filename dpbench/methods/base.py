"""The method plugin interface: a method is a mechanism and an update.

A method is a frozen record (``DPMethod``: its name, settings, mechanism class, update class,
``private``, ``tasks``); the loop (``dpbench.training.loop``) builds the two halves from it
(``DPMethod.halves``) and calls each hook on its own half: ``mechanism.<hook>``,
``update.<hook>``. The update is built without the mechanism and holds no reference to it.
Stages that touch raw data or privacy (per-example gradients, noise, the accountant) belong
to the loop and are not hooks:

====  ==============================  =========  ==============================================
 0    ``configure_model(model, s)``    record     model-side methods (bounded AdaLN modulation)
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
 --   ``evaluate(held_out)``           update     the test metrics from the loop's values
      ``evaluation_samples()``                    (IVON: averaged over posterior samples)
====  ==============================  =========  ==============================================

The mechanism (``dpbench.methods.mechanism``) is all of a method that can change epsilon;
the update (``dpbench.methods.update``) is post-processing of released values. Methods read
the noise level from ``ctx.noise_std`` (sigma_w = sigma C / B with the *expected* B), never
recompute it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from torch import nn

from dpbench.method_settings.base import NoSettings, checked_settings
from dpbench.methods.context import EvalPoint, HeldOut, Released, RunInfo, StepContext
from dpbench.methods.mechanism import ExtraQuery, Mechanism, NoiseShaper, gradient_queries
from dpbench.methods.update import OptimizerFactory, Update

__all__ = ["DPMethod", "EvalPoint", "ExtraQuery", "Halves", "HeldOut", "Mechanism",
           "NoiseShaper", "OptimizerFactory", "Released", "RunInfo", "StepContext", "Update",
           "gradient_queries"]


@dataclass(frozen=True)
class DPMethod:
    """A method: its name, settings and halves (defaults: DP-SGD), as a frozen record.

    Registered with its settings' defaults (``register_method``); ``configured`` returns the
    run's record, settings checked and the YAML's optimiser factory attached. The record
    defines no hook: the loop builds the halves (``halves()``) and calls them directly.
    """

    name: str
    #: the frozen dataclass of ``method.settings``: keys, types, defaults, range checks
    settings: Any = NoSettings()
    #: what is released: every hook that can change epsilon
    mechanism_cls: type[Mechanism] = Mechanism
    #: what is done with the release: post-processing
    update_cls: type[Update] = Update
    #: False for the non-private baseline: no clipping, no noise, epsilon = inf
    private: bool = True
    #: task kinds this method supports (None: every task)
    tasks: frozenset[str] | None = None
    #: the method reads materialised per-example gradients itself (a combination of several
    #: evaluation points does not need them: the loop forms it, under bk and hooks alike)
    needs_per_example_grads: bool = False
    #: stage 0, model-side methods: ``configure_model(model, settings)`` returns the model
    configure_model: Callable[[nn.Module, Any], nn.Module] | None = None
    #: the update's optimiser factory (a Hydra ``_partial_``; None: SGD with lr 0.1)
    optimizer: OptimizerFactory | None = None
    #: set on a record whose mechanism is broken on purpose (the audit's tests only)
    broken_on_purpose: str | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.mechanism_cls, type) and issubclass(self.mechanism_cls, Mechanism)
                and isinstance(self.update_cls, type) and issubclass(self.update_cls, Update)):
            raise TypeError(f"method {self.name!r}: mechanism_cls must be a Mechanism subclass "
                            "and update_cls an Update subclass")
        if not dataclasses.is_dataclass(self.settings) or isinstance(self.settings, type) \
                or not type(self.settings).__dataclass_params__.frozen:
            raise TypeError(f"method {self.name!r}: settings must be an instance of a frozen "
                            "dataclass")

    @property
    def settings_cls(self) -> type:
        """The dataclass of ``method.settings``."""
        return type(self.settings)

    def settings_defaults(self) -> dict[str, Any]:
        """Return the method's settings and their defaults (``settings_cls``'s fields)."""
        return dataclasses.asdict(self.settings_cls())

    def configured(self, optimizer: OptimizerFactory | None = None,
                   **settings: Any) -> DPMethod:
        """Return the run's record: ``settings`` checked against ``settings_cls`` over its
        defaults (ConfigError naming the key) and ``optimizer`` the update's factory."""
        return dataclasses.replace(
            self, settings=checked_settings(self.name, self.settings_cls, settings),
            optimizer=optimizer)

    def halves(self) -> Halves:
        """Return a fresh mechanism and a fresh update, built apart: the update is handed
        the name, the settings and the optimiser factory, never the mechanism."""
        return Halves(self.mechanism_cls(self.name, self.settings),
                      self.update_cls(self.name, self.settings, self.optimizer))

    def planned_bands(self) -> int | None:
        """Return the mechanism's ``participation_bands()`` (None: Poisson), read before the
        run is built (its privacy plan): a fresh mechanism's answer, from the settings alone."""
        return self.mechanism_cls(self.name, self.settings).participation_bands()

    def gradient_evaluations_per_step(self) -> int:
        """Return how many gradient evaluations a step makes (compute, not privacy): a
        fresh mechanism's answer, from the settings alone (engine choice before set-up)."""
        return self.mechanism_cls(self.name, self.settings).gradient_evaluations_per_step()


@dataclass(frozen=True)
class Halves:
    """A run's mechanism and update, as the loop holds them: the loop calls each half's hooks
    directly; this record keeps what concerns both (set-up, results.json facts, the
    checkpoint). Neither half holds the other or this record."""

    mechanism: Mechanism
    update: Update

    @property
    def params(self) -> list[nn.Parameter]:
        """The trainable parameters (the update's list; the mechanism's is the same)."""
        return self.update.params

    def setup(self, params: list[nn.Parameter], info: RunInfo) -> None:
        """Check and set up the mechanism, then the update, then bring the mechanism's moving
        parameters to the update's public state (``advance`` with no release)."""
        self.mechanism.validate(info)
        self.mechanism.setup(params, info)
        self.update.setup(params, info)
        self.resync()

    def resync(self) -> None:
        """Call the mechanism's ``advance`` with no release: set-up and after a restore."""
        self.mechanism.advance(Released(step=None,
                                        public=MappingProxyType(self.update.public_state())))

    def step_metrics(self) -> dict[str, float]:
        """Return both halves' per-step diagnostics (the mechanism's first)."""
        return {**self.mechanism.step_metrics(), **self.update.step_metrics()}

    def summary(self) -> dict[str, Any]:
        """Return method facts for results.json: the evaluations per step, then both halves'."""
        return {"gradient_evaluations_per_step": self.mechanism.gradient_evaluations_per_step(),
                **self.mechanism.summary(), **self.update.summary()}

    def state_dict(self) -> dict[str, Any]:
        """Return the optimiser's state and, under ``extra``, both halves' state."""
        optimizer = self.update.optimizer
        return {"optimizer": optimizer.state_dict() if optimizer else None,
                "extra": {**self.mechanism.state_dict(), **self.update.state_dict()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        optimizer = self.update.optimizer
        if optimizer is not None and state.get("optimizer") is not None:
            optimizer.load_state_dict(state["optimizer"])
        extra = state.get("extra") or {}
        self.mechanism.load_state_dict(extra)
        self.update.load_state_dict(extra)
        if self.update.info is not None:  # set up: the restored weights and update state
            self.resync()

