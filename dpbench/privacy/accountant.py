"""Opacus accountants with calibration, a PRV -> RDP fallback and checkpointable state.

Nothing here is written by hand: epsilon and the noise multiplier come from
``opacus.accountants`` (``create_accountant``, ``get_noise_multiplier``). This module only
chooses the accountant, falls back from PRV to RDP with a warning when PRV cannot handle a
regime, and keeps the accountant's state so a resumed run continues the same accountant.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any

from opacus.accountants import create_accountant
from opacus.accountants.utils import get_noise_multiplier

from dpbench.errors import ConfigError

log = logging.getLogger(__name__)

ACCOUNTANTS = ("prv", "rdp", "gdp")


def default_delta(dataset_size: int) -> float:
    """Return min(1e-5, 1/N') with N' = N rounded up to a power of ten (docs/privacy.md)."""
    rounded = 10 ** math.ceil(math.log10(max(dataset_size, 1)))
    return min(1e-5, 1.0 / rounded)


def _check_accountant(name: str) -> None:
    if name not in ACCOUNTANTS:
        raise ConfigError(
            f"privacy.accountant must be one of {', '.join(ACCOUNTANTS)} (got {name!r})"
        )


def calibrate_noise_multiplier(
    target_epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str
) -> tuple[float, str]:
    """Return (sigma, accountant used) so that T steps at rate q spend at most target_epsilon.

    Uses Opacus's bisection (``get_noise_multiplier``); PRV failures fall back to RDP, which
    is looser (a larger sigma), so the fallback never under-reports.
    """
    _check_accountant(accountant)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sigma = get_noise_multiplier(
                target_epsilon=target_epsilon,
                target_delta=delta,
                sample_rate=sample_rate,
                steps=steps,
                accountant=accountant,
                epsilon_tolerance=0.005 * target_epsilon,
            )
        return float(sigma), accountant
    except Exception as err:  # PRV raises on regimes its grid does not cover
        if accountant != "prv":
            raise ConfigError(
                f"cannot calibrate noise for epsilon={target_epsilon}, delta={delta}, "
                f"q={sample_rate}, steps={steps} with the {accountant} accountant: {err}"
            ) from err
        log.warning("PRV calibration failed (%s); falling back to the RDP accountant", err)
        warnings.warn(f"PRV accountant failed ({err}); using RDP", RuntimeWarning, stacklevel=2)
        return calibrate_noise_multiplier(target_epsilon, delta, sample_rate, steps, "rdp")


class PrivacyAccountant:
    """An Opacus accountant stepped once per logical step, with a fallback on evaluation."""

    def __init__(self, mechanism: str) -> None:
        _check_accountant(mechanism)
        self.mechanism = mechanism
        self._accountant = create_accountant(mechanism)

    def step(self, noise_multiplier: float, sample_rate: float) -> None:
        self._accountant.step(noise_multiplier=noise_multiplier, sample_rate=sample_rate)

    @property
    def steps(self) -> int:
        return sum(int(n) for _, _, n in self._accountant.history)

    def get_epsilon(self, delta: float) -> float:
        """Return epsilon spent so far (0 before any step)."""
        if not self._accountant.history:
            return 0.0
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return float(self._accountant.get_epsilon(delta=delta))
        except Exception as err:
            if self.mechanism != "prv":
                raise
            log.warning("PRV epsilon failed (%s); reporting the RDP epsilon instead", err)
            fallback = create_accountant("rdp")
            fallback.history = list(self._accountant.history)
            self.mechanism = "rdp"
            self._accountant = fallback
            return float(fallback.get_epsilon(delta=delta))

    def state_dict(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "history": list(self._accountant.history)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mechanism = state["mechanism"]
        self._accountant = create_accountant(self.mechanism)
        self._accountant.history = [tuple(h) for h in state["history"]]
