"""Non-private baseline: the same loop with no clipping and no noise (epsilon = inf)."""

from dpbench.methods import register_method
from dpbench.methods.base import DPMethod


@register_method("nonprivate")
class NonPrivate(DPMethod):
    """Plain mini-batch training: mean gradient of the realised batch, then the optimiser."""

    private = False
