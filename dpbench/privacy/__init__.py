"""Accounting, calibration and the privacy ledger: the only place epsilon is computed."""

from dpbench.privacy.accountant import (
    ACCOUNTANTS,
    DEFAULT_ACCOUNTANT,
    PrivacyAccountant,
    check_accountable,
    check_accountant,
    compose_epsilon,
    default_delta,
)
from dpbench.privacy.banded_mf import amplified_equivalent
from dpbench.privacy.calibration import calibrate_noise_multiplier
from dpbench.privacy.ledger import PrivacyLedger, Query, combined_noise_multiplier

__all__ = [
    "ACCOUNTANTS",
    "DEFAULT_ACCOUNTANT",
    "PrivacyAccountant",
    "PrivacyLedger",
    "Query",
    "amplified_equivalent",
    "calibrate_noise_multiplier",
    "check_accountable",
    "check_accountant",
    "combined_noise_multiplier",
    "compose_epsilon",
    "default_delta",
]
