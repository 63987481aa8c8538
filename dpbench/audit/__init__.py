"""Empirical privacy audits: a lower bound on epsilon from canaries inserted into one run."""

from dpbench.audit.bounds import epsilon_lower_bound, p_value_dp_audit

__all__ = ["epsilon_lower_bound", "p_value_dp_audit"]
