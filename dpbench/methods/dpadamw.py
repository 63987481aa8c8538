"""DP-AdamW: the DP-SGD release followed by AdamW (Loshchilov and Hutter 2019)."""

from dpbench.methods import register_method
from dpbench.methods.base import DPMethod

#: only stage 8 differs from DP-SGD; the optimiser (torch.optim.AdamW) comes from the YAML
DPADAMW = register_method(DPMethod("dpadamw"))
