"""Amplified banded matrix factorization (BandMF, MF-DP-FTRL): correlated noise across steps.

Choquette-Choo, Ganesh, McKenna, McMahan, Rush, Thakurta, Xu, "(Amplified) Banded Matrix
Factorization: A unified approach to private training", NeurIPS 2023 (arXiv 2306.08153).

Per step t (the loop runs every stage; this method only configures two of them):

* sampling: cyclic Poisson over b fixed partitions (``participation_bands`` -> b), so an
  example takes part at most once in any b consecutive steps (``training/batch_samplers.py``);
* release: g_hat_t = (sum_i clip(g_i) + sigma S w_t) / B with w = C^{-1} Z, C the b-banded
  unit-norm Toeplitz strategy, computed by the recursion of ``privacy/banded_mf.py`` from the
  last b - 1 noise vectors (``noise_shaper``; memory b x params);
* the base optimiser from the YAML (SGD with momentum, Adam, ...) consumes g_hat:
  post-processing.

Privacy (their Thm 4): as DP-SGD with the same sigma, rate b B / N and ceil(T / b) steps;
the loop calibrates and accounts exactly that. b = 1 is DP-SGD, draw for draw.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from torch import nn

from dpbench.errors import ConfigError
from dpbench.method_settings.bandmf import BandMFSettings
from dpbench.methods import register_method
from dpbench.methods.base import DPMethod, Mechanism, RunInfo
from dpbench.privacy.banded_mf import (
    BandedNoiseShaper,
    amplified_equivalent,
    noise_memory_bytes,
    prefix_sum_loss,
    strategy_coefficients,
)


def available_memory_bytes(device: torch.device) -> int | None:
    """Return the free memory of ``device`` (None when it cannot be read)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


class BandedMatrixFactorization(Mechanism):
    """DP-SGD's clipping with cyclic Poisson sampling and banded correlated noise."""

    settings: BandMFSettings

    def __init__(self, name: str, settings: BandMFSettings) -> None:
        super().__init__(name, settings)
        self.coefs: np.ndarray | None = None

    def participation_bands(self) -> int:
        return self.settings.bands

    def setup(self, params: list[nn.Parameter], info: RunInfo) -> None:
        """Build the strategy; refuse if the noise history will not fit."""
        super().setup(params, info)
        self.coefs = strategy_coefficients(self.settings.strategy, self.settings.bands,
                                           info.total_steps)
        if not info.private:
            return
        need = noise_memory_bytes(self.settings.bands, sum(p.numel() for p in params),
                                  params[0].element_size() if params else 4)
        free = available_memory_bytes(info.device)
        if free is not None and need > free:
            raise ConfigError(
                f"method.settings.bands={self.settings.bands}: the correlated noise keeps b "
                f"vectors of the model's size ({need / 2**30:.2f} GiB) but only "
                f"{free / 2**30:.2f} GiB is free on {info.device}; lower bands")

    def noise_shaper(self, info: RunInfo) -> BandedNoiseShaper:
        """Return the C^{-1} recursion, with C's n x n columns normalised (n = T)."""
        assert self.coefs is not None, "setup() builds the strategy first"
        return BandedNoiseShaper(self.coefs, total_steps=info.total_steps)

    def summary(self) -> dict[str, Any]:
        """Return the mechanism and the DP-SGD it is accounted as (Thm 4)."""
        if self.info is None or self.coefs is None:
            return {}
        rate, steps = amplified_equivalent(self.info.sample_rate, self.info.total_steps,
                                           self.settings.bands)
        n = self.info.total_steps
        return {
            "mechanism": "amplified banded matrix factorization (cyclic Poisson, b-banded "
                         "Toeplitz C, unit-norm columns)",
            "bands": self.settings.bands, "strategy": self.settings.strategy,
            "coefficients": [float(c) for c in self.coefs],
            "prefix_sum_loss": prefix_sum_loss(self.coefs, n) / n,
            "dpsgd_prefix_sum_loss": prefix_sum_loss(np.ones(1), n) / n,
            "equivalent_dpsgd": {"noise_multiplier": self.info.noise_multiplier,
                                 "sample_rate": rate, "steps": steps},
        }


#: BandMF's mechanism; the update is the YAML's optimiser on the released gradient
BANDMF = register_method(DPMethod("bandmf", BandMFSettings(), BandedMatrixFactorization))
