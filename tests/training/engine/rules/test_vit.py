"""Book-keeping's rule for a timm VisionTransformer's own parameters (``rules/vit.py``):
``cls_token``, register tokens and ``pos_embed``, read where they enter."""

from __future__ import annotations

import pytest
import torch

from dpbench.training.engine.rules.vit import ViTRule
from tests.training.engine.rules import grid

timm = pytest.importorskip("timm")
VIT_KW = dict(img_size=16, patch_size=8, depth=1, embed_dim=8, num_heads=2, num_classes=3)


@pytest.mark.parametrize("settings", [
    {},  # class token, pos_embed over [cls; patches]
    {"no_embed_class": True, "reg_tokens": 2},  # pos_embed over the patches only
    {"pos_embed": "none", "reg_tokens": 1},  # the tokens enter by concatenation alone
], ids=lambda s: str(s) or "default")
def test_vit_own_parameters_are_exact(settings):
    torch.manual_seed(0)
    grid.assert_bk_exact(grid.Case(f"vit {settings}", grid.families.ViTFeatures(**settings),
                                   torch.randn(3, 3, 16, 16)))


def test_vit_entry_is_where_the_parameters_enter():
    vit = timm.models.vision_transformer.VisionTransformer(**VIT_KW)
    rule = ViTRule()
    assert rule.entry(vit) is vit.pos_drop
    no_pos = timm.models.vision_transformer.VisionTransformer(pos_embed="none", **VIT_KW)
    assert rule.entry(no_pos) is no_pos.patch_drop
    grid.assert_rule(vit, ViTRule)


class _OwnPosEmbed(timm.models.vision_transformer.VisionTransformer):
    def _pos_embed(self, x):
        return super()._pos_embed(x) + self.pos_embed


@pytest.mark.parametrize("model,why", [
    (lambda: timm.models.vision_transformer.VisionTransformer(dynamic_img_size=True, **VIT_KW),
     "VisionTransformer with dynamic_img_size"),
    (lambda: _OwnPosEmbed(**VIT_KW), "_OwnPosEmbed overrides _pos_embed"),
], ids=["dynamic_img_size", "own _pos_embed"])
def test_vit_structural_checks(model, why):
    grid.assert_refused(model(), why)
