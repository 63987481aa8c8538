"""The method plugin interface: one DP step split into stages a method may override.

The loop (``dpbench.training.loop``) runs the step of docs/adding-a-method.md; a method
overrides only the stages that define it. Stages that touch raw data or privacy (per-example
gradients, noise, the accountant) belong to the loop and are not hooks:

====  ==============================  =========================================================
 0    ``configure_model(model)``       model-side methods (e.g. bounded AdaLN modulation)
 1    ``participation_bands()``        sampling the loop runs: Poisson (None) or cyclic Poisson
                                       over b fixed partitions (BandMF; accounted as amplified)
 2    ``evaluation_points(ctx)``       where gradients are taken: [theta] by default; IVON a
                                       posterior sample; DiSK/FIBER theta and theta + gamma d
 4    (loop) u_i = sum_k w_k g_i(pt_k) combined per example *before* clipping
 5    ``clip_factors(norms, ctx)``     per-example factors; ``sensitivity(ctx)`` bounds
                                       ||factor_i * u_i|| (the loop checks it every step)
 6    ``gradient_noise_multiplier``    sigma used for the gradient query (adaptive clipping
      ``extra_queries(norms, ctx)``    splits sigma); extra privatised queries (noisy count)
      ``noise_shaper(info)``           the loop's i.i.d. gradient noise -> released noise
                                       (BandMF's C^{-1} recursion; state checkpointed by the loop)
 7    ``postprocess(grads, ctx)``      filters, spectral denoising (free: post-processing)
 8    ``update(grads, ctx)``           the optimiser step (SGD/Adam/AdamW/AdamBC/FIBER/IVON)
 9    ``after_step(released, ctx)``    e.g. the adaptive threshold update from a noisy count
 --   ``evaluate(task, model, ...)``   extra evaluation (posterior averaging)
====  ==============================  =========================================================

Everything after stage 6 is post-processing of the released gradient and cannot change
epsilon. Methods read the noise level from ``ctx.noise_std`` (sigma_w = sigma C / B with the
*expected* B), never recompute it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from dpbench.methods.settings import NoSettings, checked_settings
from dpbench.privacy.ledger import Query

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


class NoiseShaper(Protocol):
    """Turns a step's i.i.d. Gaussian noise (one tensor per parameter) into released noise."""

    def __call__(self, noise: list[torch.Tensor]) -> list[torch.Tensor]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any], device: torch.device | None = None
                        ) -> None: ...


@dataclass
class StepContext:
    """What a method may know about the current step (no raw data)."""

    step: int
    epoch: int
    private: bool
    noise_multiplier: float  # sigma the accountant is told (combined over the step's queries)
    clip_norm: float  # C from the privacy config (a method may use its own threshold)
    expected_batch_size: float  # B = q N: every mean divides by this, never the realised size
    sample_rate: float
    dataset_size: int
    total_steps: int
    generator: torch.Generator | None = None  # the loop's noise RNG (the release only)
    method_generator: torch.Generator | None = None  # the method's own stream (posterior draws)
    noise_std: float = 0.0  # per-coordinate std of the released mean gradient, set by the loop


@dataclass
class EvalPoint:
    """A point at which per-example gradients are taken, and its weight in the combination.

    ``offsets`` (one tensor per trainable parameter, or None for theta itself) is added to the
    parameters for the evaluation and removed afterwards.
    """

    weight: float = 1.0
    offsets: Sequence[torch.Tensor] | None = None


@dataclass
class ExtraQuery:
    """A privatised per-example query besides the gradient (e.g. a clip indicator).

    ``values`` holds one number per example, each within [-sensitivity, sensitivity] (the loop
    checks it); the loop sums them, adds N(0, noise_std^2) and hands the noisy sum back to
    ``after_step`` under ``name``.
    """

    name: str
    values: torch.Tensor
    sensitivity: float
    noise_std: float


@dataclass
class RunInfo:
    """Facts a method may need at set-up time."""

    dataset_size: int
    expected_batch_size: float
    sample_rate: float
    total_steps: int
    noise_multiplier: float
    clip_norm: float
    private: bool
    task: str
    device: torch.device
    extras: dict[str, Any] = field(default_factory=dict)


class DPMethod:
    """DP-SGD with flat clipping; subclasses override the stages that define them.

    Settings arrive as keyword arguments from ``conf/method/<name>.yaml``, checked against
    ``settings_cls`` (``self.settings`` is the checked dict); ``optimizer`` is a Hydra
    ``_partial_`` optimiser factory.
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

    def __init__(self, optimizer: OptimizerFactory | None = None, **settings: Any) -> None:
        self.optimizer_factory = optimizer or (lambda p: torch.optim.SGD(p, lr=0.1))
        self.settings = checked_settings(self.name, self.settings_cls, settings)
        self.params: list[nn.Parameter] = []
        self.optimizer: torch.optim.Optimizer | None = None
        self.info: RunInfo | None = None

    # ---- configuration -------------------------------------------------------------------
    @classmethod
    def settings_defaults(cls) -> dict[str, Any]:
        """Return the method's settings and their defaults (``settings_cls``'s fields)."""
        return asdict(cls.settings_cls())

    def validate(self, info: RunInfo) -> None:
        """Raise ``ConfigError`` for settings that cannot run (checked before training)."""

    def gradient_evaluations_per_step(self) -> int:
        """Return how many gradient evaluations a step makes (compute, not privacy)."""
        return 1

    # ---- stages the loop runs but the method configures: sampling and noise shape -------
    def participation_bands(self) -> int | None:
        """Return b for cyclic Poisson sampling over b fixed partitions (None: plain Poisson).

        With b, step t samples partition t mod b at rate b q and the loop accounts the run
        as DP-SGD at rate b q for ceil(T / b) steps (BandMF's amplification theorem).
        """
        return None

    def noise_shaper(self, info: RunInfo) -> NoiseShaper | None:
        """Return the map from each step's i.i.d. gradient noise to the noise released.

        None: i.i.d. noise (DP-SGD). The loop owns the object (its state is checkpointed
        with the loop's); it must keep each step's per-participation sensitivity.
        """
        return None

    # ---- stage 0: model side -------------------------------------------------------------
    def configure_model(self, model: nn.Module) -> nn.Module:
        return model

    def setup(self, params: list[nn.Parameter], info: RunInfo) -> None:
        """Build the optimiser and any state over the trainable parameters."""
        self.params = params
        self.info = info
        self.optimizer = self.optimizer_factory(params)

    # ---- stage 2: evaluation points ------------------------------------------------------
    def evaluation_points(self, ctx: StepContext) -> list[EvalPoint]:
        return [EvalPoint()]

    # ---- stage 5: clipping ---------------------------------------------------------------
    def clip_factors(self, norms: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Return per-example factors: flat clipping min(1, C / ||u_i||) (Abadi et al. 2016)."""
        return (ctx.clip_norm / (norms + 1e-6)).clamp(max=1.0)

    def sensitivity(self, ctx: StepContext) -> float:
        """Return the L2 bound on one example's clipped contribution (C for flat clipping)."""
        return ctx.clip_norm

    # ---- stage 6: privatised queries -----------------------------------------------------
    def gradient_noise_multiplier(self, sigma: float) -> float:
        """Return the multiplier of the gradient query's noise (sigma unless split)."""
        return sigma

    def extra_queries(self, norms: torch.Tensor, ctx: StepContext) -> list[ExtraQuery]:
        return []

    # ---- stage 7: post-processing --------------------------------------------------------
    def postprocess(self, grads: list[torch.Tensor], ctx: StepContext) -> list[torch.Tensor]:
        return grads

    # ---- stage 8: the update -------------------------------------------------------------
    def update(self, grads: list[torch.Tensor], ctx: StepContext) -> None:
        assert self.optimizer is not None
        for p, g in zip(self.params, grads):
            p.grad = g
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    # ---- stage 9 -------------------------------------------------------------------------
    def after_step(self, released: dict[str, torch.Tensor], ctx: StepContext) -> None:
        pass

    # ---- evaluation and diagnostics ------------------------------------------------------
    def evaluate(self, task: Any, model: nn.Module, loader: Any, device: torch.device) -> dict:
        """Return test metrics; default: the task's evaluation at the current weights."""
        return task.evaluate(model, loader, device)

    def step_metrics(self) -> dict[str, float]:
        """Return per-step diagnostics to log (e.g. the current clip threshold)."""
        return {}

    def summary(self) -> dict[str, Any]:
        """Return method facts for results.json (e.g. gradient evaluations per step)."""
        return {"gradient_evaluations_per_step": self.gradient_evaluations_per_step()}

    # ---- checkpointing -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict() if self.optimizer else None,
                "extra": self.extra_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.optimizer is not None and state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.load_extra_state(state.get("extra") or {})

    def extra_state(self) -> dict[str, Any]:
        """Return method state beyond the optimiser (filter state, thresholds)."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        pass


def gradient_queries(method: DPMethod, ctx: StepContext, sigma: float,
                     extra: Sequence[ExtraQuery]) -> list[Query]:
    """Return the ledger entries of a step: the gradient query and the method's extra ones."""
    sens = method.sensitivity(ctx)
    grad_sigma = method.gradient_noise_multiplier(sigma)
    queries = [Query("gradient", sens, grad_sigma * sens)]
    queries += [Query(q.name, q.sensitivity, q.noise_std) for q in extra]
    if not all(math.isfinite(q.noise_std) for q in queries):
        raise ValueError("non-finite noise std")
    return queries
