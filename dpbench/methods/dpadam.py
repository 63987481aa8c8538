"""DP-Adam: the DP-SGD release followed by Adam (Kingma and Ba 2015) on the noisy gradient."""

from dpbench.methods import register_method
from dpbench.methods.base import DPMethod

#: only stage 8 differs from DP-SGD; the optimiser (torch.optim.Adam) comes from the YAML
DPADAM = register_method(DPMethod("dpadam"))
