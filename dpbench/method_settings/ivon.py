"""``method.settings`` of IVON (``dpbench/methods/ivon.py``, ``conf/method/ivon.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass

from dpbench.errors import ConfigError
from dpbench.method_settings import register_settings
from dpbench.method_settings.base import require

HESS_ESTIMATES = ("reparam", "gradsq")


@register_settings("ivon")
@dataclass(frozen=True)
class IVONSettings:
    """``method.settings`` of IVON (and, with ``hess=gradsq``, of DP-IVON)."""

    hess: str = "reparam"  # reparam | gradsq
    mc_samples: int = 1  # posterior samples per step (gradients averaged; reparam needs 1)
    correction: bool = True  # gradsq only: subtract the DP noise variance (0 when non-private)
    eval_samples: int = 32  # S for Bayesian model averaging at evaluation (0: at the mean)
    eval_seed: int = 0

    def __post_init__(self) -> None:
        require(self.hess in HESS_ESTIMATES, "hess", f"one of {HESS_ESTIMATES}", self.hess)
        require(self.mc_samples >= 1, "mc_samples", "an integer >= 1", self.mc_samples)
        if self.hess == "reparam" and self.mc_samples != 1:
            raise ConfigError("method.settings.hess=reparam needs mc_samples=1: the loop "
                              "averages the samples' gradients, so g * (theta - m) per sample "
                              "is not available; use hess=gradsq for mc_samples > 1")
        require(self.eval_samples >= 0, "eval_samples", "an integer >= 0", self.eval_samples)
