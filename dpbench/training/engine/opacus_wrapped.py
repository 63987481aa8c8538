"""What the two Opacus-backed engines share: the wrapped module, its parameters, its hooks."""

from __future__ import annotations

from torch import nn

from dpbench.training.engine.protocol import trainable


class OpacusWrapped:
    """An engine over an Opacus ``GradSampleModule`` (or its ghost-clipping subclass)."""

    def __init__(self, model: nn.Module, module: nn.Module) -> None:
        self.combines_points = False
        self.module = module
        self.params, self.names = trainable(model)

    def close(self) -> None:
        """Remove Opacus's hooks from the model (the loop falls back to another engine)."""
        self._clear()
        self.module._close()

    def _clear(self) -> None:
        for p in self.params:
            p.grad = None
            p.grad_sample = None
            if hasattr(p, "_norm_sample"):  # ghost clipping's per-example norms
                p._norm_sample = None
