"""DP-Adam: the DP-SGD release followed by Adam (Kingma and Ba 2015) on the noisy gradient."""

from dpbench.methods import register_method
from dpbench.methods.base import DPMethod


@register_method("dpadam")
class DPAdam(DPMethod):
    """Only stage 8 differs from DP-SGD; the optimiser (torch.optim.Adam) comes from the YAML."""
