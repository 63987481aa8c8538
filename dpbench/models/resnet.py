"""torchvision's ResNet-18 made DP-ready: GroupNorm, out-of-place ReLU and residual add.

Stock torchvision ResNet-18 passes Opacus's ModuleValidator and then fails in every
grad-sample mode ("Output 0 of BackwardHookFunction is a view and is being modified
inplace"): its in-place ReLU and ``out += identity`` must be out-of-place (docs/reliability.md,
models). BatchNorm mixes examples, so it becomes GroupNorm(32 groups).
"""

from __future__ import annotations

import functools

from torch import Tensor, nn

from dpbench.models import register_model


@functools.cache
def out_of_place_basic_block() -> type[nn.Module]:
    """Return torchvision's BasicBlock with ``out = out + identity`` and out-of-place ReLU.

    torchvision is imported here, on first use, not when the model registry loads: it costs
    most of a second of every run's start-up (docs/engine.md, start-up).
    """
    from torchvision.models.resnet import BasicBlock

    class OutOfPlaceBasicBlock(BasicBlock):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.relu = nn.ReLU(inplace=False)

        def forward(self, x: Tensor) -> Tensor:
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + identity)

    return OutOfPlaceBasicBlock


def dp_ready_resnet18(num_classes: int, groups: int = 32) -> nn.Module:
    """Return torchvision's ResNet-18 with GroupNorm(groups) and out-of-place ReLU/add."""
    from torchvision.models.resnet import ResNet

    model = ResNet(out_of_place_basic_block(), [2, 2, 2, 2], num_classes=num_classes,
                   norm_layer=functools.partial(nn.GroupNorm, groups))
    model.relu = nn.ReLU(inplace=False)
    return model


@register_model("resnet18")
def resnet18(input_shape, num_classes: int, groups: int = 32,
             small_input: bool = True) -> nn.Module:
    """Return ResNet-18 (GroupNorm); ``small_input`` swaps the stem for a 3x3 conv (32x32)."""
    model = dp_ready_resnet18(num_classes, groups)
    if small_input or input_shape[0] != 3:
        model.conv1 = nn.Conv2d(input_shape[0], 64, 3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    return model
