"""Errors dpbench raises on purpose, each with a message a user can act on."""


class DPBenchError(Exception):
    """Base class: the CLI prints these without a traceback and exits non-zero."""


class ConfigError(DPBenchError, ValueError):
    """A setting is invalid; raised before any training starts."""


class DataError(DPBenchError):
    """A data set is missing, corrupt or cannot be downloaded."""


class PrivacyError(DPBenchError):
    """The mechanism that ran does not match what the accountant was told."""


class TrainingDiverged(DPBenchError):
    """The loss or the gradients became NaN or infinite."""
