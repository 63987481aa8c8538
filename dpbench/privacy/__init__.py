"""Accounting, calibration and the privacy ledger: the only place epsilon is computed."""

from dpbench.privacy.accountant import (
    ACCOUNTANTS,
    PrivacyAccountant,
    calibrate_noise_multiplier,
    default_delta,
)
from dpbench.privacy.banded_mf import amplified_equivalent
from dpbench.privacy.ledger import PrivacyLedger, Query, combined_noise_multiplier

__all__ = [
    "ACCOUNTANTS",
    "PrivacyAccountant",
    "PrivacyLedger",
    "Query",
    "amplified_equivalent",
    "calibrate_noise_multiplier",
    "combined_noise_multiplier",
    "default_delta",
]
