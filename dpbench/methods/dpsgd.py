"""DP-SGD (Abadi et al. 2016, Alg. 1): flat clipping, one Gaussian release, SGD update."""

from dpbench.methods import register_method
from dpbench.methods.base import DPMethod


@register_method("dpsgd")
class DPSGD(DPMethod):
    """Every stage is the base class's default; the optimiser (SGD) comes from the YAML."""
