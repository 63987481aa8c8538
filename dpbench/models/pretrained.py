"""Pretrained ImageNet backbones for DP fine-tuning (FIBER's CIFAR-100 setting): users' machines.

* ``vit_small``: timm's ``vit_small_patch16_224`` (the paper's ViT-small; timm's attention is
  built from ``nn.Linear``, so Opacus's per-sample gradients are exact);
* ``resnet18``: torchvision's ImageNet ResNet-18 made DP-ready (GroupNorm replaces BatchNorm,
  whose pretrained statistics are therefore dropped; out-of-place ReLU and residual add).

Images are upsampled inside the model to the backbone's resolution (a parameter-free layer),
so the data stay at their native size. Weights come from the timm / torchvision caches or a
download; offline without a cached copy the builder raises a ``ConfigError`` that says so.
"""

from __future__ import annotations

from torch import nn

from dpbench.errors import ConfigError
from dpbench.models import register_model

ARCHS = ("vit_small", "resnet18")
TRAINABLE = ("all", "head")


def _offline_error(arch: str, err: Exception) -> ConfigError:
    return ConfigError(
        f"model=pretrained arch={arch}: the pretrained weights are not cached and could not be "
        f"downloaded ({type(err).__name__}: {err}). This preset is for machines with internet "
        "access (or a warm timm/torch hub cache); offline, use model=cnn2 or resnet18")


def _vit_small(num_classes: int, pretrained: bool, size: int | None) -> tuple[nn.Module, int, str]:
    try:
        import timm
    except ImportError as err:
        raise ConfigError("model=pretrained arch=vit_small needs timm: pip install "
                          "'dpbench[vision]' (or pip install timm)") from err
    try:
        model = timm.create_model("vit_small_patch16_224", pretrained=pretrained,
                                  num_classes=num_classes, img_size=size or 224)
    except Exception as err:  # hub unreachable and no cached copy (several error types)
        raise _offline_error("vit_small", err) from err
    return model, size or 224, "head"


def _resnet18(num_classes: int, pretrained: bool, size: int | None) -> tuple[nn.Module, int, str]:
    from torchvision.models import ResNet18_Weights

    from dpbench.models.resnet import dp_ready_resnet18

    model = dp_ready_resnet18(1000)
    if pretrained:
        try:
            state = ResNet18_Weights.IMAGENET1K_V1.get_state_dict(progress=False,
                                                                  weights_only=True)
        except (OSError, RuntimeError, ValueError) as err:  # URLError is an OSError
            raise _offline_error("resnet18", err) from err
        # GroupNorm takes BatchNorm's affine weights; running statistics have no slot
        state = {k: v for k, v in state.items() if "running_" not in k and
                 "num_batches_tracked" not in k}
        model.load_state_dict(state)
    model.fc = nn.Linear(model.fc.in_features, num_classes)
    return model, size or 224, "fc"


@register_model("pretrained")
def pretrained(input_shape, num_classes: int, arch: str = "vit_small", weights: bool = True,
               trainable: str = "all", resolution: int | None = None) -> nn.Module:
    """Return ``Upsample -> backbone`` with a fresh ``num_classes`` head."""
    if arch not in ARCHS:
        raise ConfigError(f"model.arch must be one of {ARCHS} (got {arch!r})")
    if trainable not in TRAINABLE:
        raise ConfigError(f"model.trainable must be one of {TRAINABLE} (got {trainable!r})")
    if input_shape[0] != 3:
        raise ConfigError(f"model=pretrained needs RGB images (got {input_shape[0]} channels)")
    build = _vit_small if arch == "vit_small" else _resnet18
    backbone, size, head = build(num_classes, weights, resolution)
    if trainable == "head":
        for name, p in backbone.named_parameters():
            p.requires_grad_(name.startswith(head))
    return nn.Sequential(nn.Upsample(size=(size, size), mode="bilinear", align_corners=False),
                         backbone)
