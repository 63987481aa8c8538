"""Non-private baseline: the same loop with no clipping and no noise (epsilon = inf)."""

from dpbench.methods import register_method
from dpbench.methods.base import DPMethod

#: plain mini-batch training: mean gradient of the realised batch, then the optimiser
NONPRIVATE = register_method(DPMethod("nonprivate", private=False))
