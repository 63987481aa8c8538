"""Mixed precision (``trainer.precision=bf16-mixed``): a bf16 forward, a float32 mechanism.

Only the forward that computes the per-example losses runs under ``torch.autocast`` (so its
backward follows the forward's dtypes). Everything the privacy guarantee rests on stays in
float32: the engines cast per-example gradients (or book-keeping's activations and output
gradients) to the parameters' dtype before any norm is taken, so the norms, clip factors,
clipped sum, noise and update are float32, and the clipped sum is made of exactly the vectors
whose norms were bounded (the sensitivity check is unchanged). float16 without loss scaling
would underflow small per-example gradients to 0 before clipping, and loss scaling multiplies
them before the clip: it is refused. See docs/distributed.md.
"""

from __future__ import annotations

from typing import Any

import torch


def autocast_dtype(precision: str) -> torch.dtype | None:
    """Return the forward's autocast dtype (None: plain float32)."""
    return torch.bfloat16 if precision == "bf16-mixed" else None


class MixedPrecisionTask:
    """A task whose per-example losses are computed under autocast (and returned in float32).

    Every other attribute is the wrapped task's; the per-run engine check keeps the wrapped
    task's float32 loss (it verifies the engine's algebra, which is the same code in both).
    """

    def __init__(self, task: Any, device: torch.device, dtype: torch.dtype) -> None:
        object.__setattr__(self, "task", task)
        object.__setattr__(self, "device_type", device.type)
        object.__setattr__(self, "dtype", dtype)

    def per_example_loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        with torch.autocast(device_type=self.device_type, dtype=self.dtype):
            losses = self.task.per_example_loss(model, batch)
        return losses.float()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.task, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.task, name, value)


def with_precision(task: Any, precision: str, device: torch.device) -> Any:
    """Return ``task`` with its forward in ``precision`` (the task itself for 32-true)."""
    dtype = autocast_dtype(precision)
    return task if dtype is None else MixedPrecisionTask(task, device, dtype)
