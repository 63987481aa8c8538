"""Tuning as part of the protocol: search per cell on a validation split, reuse the choices."""
