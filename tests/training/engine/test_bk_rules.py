"""Book-keeping's rules for parameters outside layers and for the layers added to its table.

Each case runs as the loop runs it (the engine chosen and checked before any release) and is
compared with the float64 one-example-at-a-time reference of ``tests/helpers/engine_grid.py``
at the tolerance of ``helpers/numerics.py``; removing one example must move the pre-noise sum by
at most C. Covered: timm's ``VisionTransformer`` (``cls_token``, register tokens, ``pos_embed``,
read where they enter), ``LayerScale``, ``nn.Conv1d`` (padding modes), ``nn.RMSNorm``, timm's
``LayerNorm2d``, ``StdConv2d`` and ``ScaledStdConv2d`` (the standardisation's Jacobian, the
gain), Opacus's ``SequenceBias`` (a learned bias appended as a token), and the structural
guards that still refuse what no rule covers.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpbench.errors import ConfigError
from dpbench.training.engine.bookkeeping import BookKeepingEngine, bk_unsupported
from tests.helpers import engine_grid as grid
from tests.helpers.grid_checks import assert_exact as _assert_exact
from tests.helpers.grid_checks import assert_neighbours as _assert_neighbours

timm = pytest.importorskip("timm")


def _runs_bk_exactly(case: grid.Case, mode: str = "bk") -> None:
    run = grid.run_case(case, mode)
    _assert_exact(run, case.name)
    assert run.engine == "bk", run.engine
    _assert_neighbours(case, run)


VIT_SETTINGS = [
    {},  # vit_small's layout: class token, pos_embed over [cls; patches]
    {"no_embed_class": True, "reg_tokens": 2},  # pos_embed over the patches only, registers
    {"class_token": False, "reg_tokens": 1, "global_pool": "avg"},
    {"pos_embed": "none", "reg_tokens": 1},  # the tokens enter by concatenation alone
    {"init_values": 0.5},  # LayerScale in every block
]


@pytest.mark.parametrize("settings", VIT_SETTINGS, ids=lambda s: str(s) or "default")
def test_vit_own_parameters_are_exact_under_bk(settings):
    torch.manual_seed(0)
    model = grid.ViTFeatures(**settings)
    assert bk_unsupported(model) is None
    _runs_bk_exactly(grid.Case(f"vit {settings}", model, torch.randn(3, 3, 16, 16)))


def test_vit_classifier_auto_picks_bk():
    from dpbench.models.pretrained import pretrained
    torch.manual_seed(1)
    model = pretrained((3, 8, 8), 4, arch="vit_small", weights=False, resolution=16)
    with torch.no_grad():
        model[1].pos_embed.normal_()
        model[1].cls_token.normal_()
    case = grid.Case("pretrained vit_small 16x16", model, torch.randn(2, 3, 8, 8))
    _runs_bk_exactly(case, "auto")


class ExtraParameterViT(timm.models.vision_transformer.VisionTransformer):
    """A ViT subclass owning a parameter the rule does not know (added to the tokens)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.token_shift = nn.Parameter(torch.zeros(kw["embed_dim"]))

    def forward_head(self, x, pre_logits: bool = False):
        return super().forward_head(x + self.token_shift, pre_logits)


class OwnPosEmbedViT(timm.models.vision_transformer.VisionTransformer):
    """A ViT subclass that adds its position embedding twice (its own ``_pos_embed``)."""

    def _pos_embed(self, x):
        return super()._pos_embed(x) + self.pos_embed


class TopBias(nn.Module):
    """A top module adding a learned bias to a layer's output: a parameter with no rule."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.shift = nn.Parameter(torch.randn(3))

    def forward(self, x):
        return self.fc(x) + self.shift


VIT_KW = dict(img_size=16, patch_size=8, depth=1, embed_dim=8, num_heads=2, num_classes=3)


@pytest.mark.parametrize("model,why", [
    (lambda: ExtraParameterViT(**VIT_KW), "token_shift"),
    (lambda: OwnPosEmbedViT(**VIT_KW), "overrides _pos_embed"),
    (lambda: timm.models.vision_transformer.VisionTransformer(dynamic_img_size=True, **VIT_KW),
     "dynamic_img_size"),
    (TopBias, "no book-keeping rule for TopBias"),
    (lambda: timm.layers.LayerScale(4, inplace=True), "inplace"),
])
def test_structural_guards_refuse_what_no_rule_covers(model, why):
    model = model()
    reason = bk_unsupported(model)
    assert reason is not None and why in reason, reason
    with pytest.raises(ConfigError, match="cannot run this model"):
        BookKeepingEngine(model)


def test_refused_vit_falls_back_to_an_exact_engine():
    torch.manual_seed(2)
    case = grid.Case("ViT with an unknown parameter", ExtraParameterViT(**VIT_KW),
                     torch.randn(2, 3, 16, 16))
    assert grid.run_case(case, "bk").status == "refused"
    run = grid.run_case(case, "auto")
    assert run.engine in ("hooks", "functorch")
    _assert_exact(run, case.name)


LAYERS = [
    ("conv1d reflect", lambda: nn.Conv1d(3, 4, 3, padding=2, padding_mode="reflect"), (4, 3, 9)),
    ("conv1d circular strided dilated", lambda: nn.Conv1d(4, 6, 3, stride=2, dilation=2,
                                                          padding=1, padding_mode="circular",
                                                          groups=2), (3, 4, 11)),
    ("conv1d same even kernel", lambda: nn.Conv1d(2, 3, 4, padding="same"), (3, 2, 8)),
    ("conv1d long (ghost)", lambda: nn.Conv1d(64, 64, 1, bias=False), (2, 64, 3)),
    ("rms_norm eps=None", lambda: nn.RMSNorm([3, 5]), (4, 2, 3, 5)),
    ("rms_norm eps=1e-3", lambda: nn.RMSNorm(6, eps=1e-3), (4, 6)),
    ("timm.LayerNorm2d", lambda: timm.layers.LayerNorm2d(5), (3, 5, 4, 3)),
    ("timm.LayerNorm (ViT's)", lambda: timm.layers.LayerNorm(6), (3, 4, 6)),
    ("timm.StdConv2d", lambda: timm.layers.StdConv2d(3, 6, 3, padding=1, bias=True),
     (3, 3, 7, 7)),
    ("timm.StdConv2d grouped strided", lambda: timm.layers.StdConv2d(4, 6, 3, stride=2,
                                                                     groups=2), (2, 4, 9, 9)),
    ("timm.ScaledStdConv2d", lambda: timm.layers.ScaledStdConv2d(3, 5, 3, gamma=1.7),
     (3, 3, 6, 6)),
    ("timm.ScaledStdConv2d ResNet-sized", lambda: timm.layers.ScaledStdConv2d(64, 64, 3),
     (2, 64, 12, 12)),
    ("timm.LayerScale", lambda: timm.layers.LayerScale(6, init_values=0.7), (3, 4, 6)),
]


@pytest.mark.parametrize("name,layer,shape", LAYERS, ids=[c[0] for c in LAYERS])
def test_new_layer_rules_are_exact(name, layer, shape):
    torch.manual_seed(3)
    module = layer()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn_like(p))
    assert bk_unsupported(module) is None
    _runs_bk_exactly(grid.Case(name, module, torch.randn(shape)))
    _runs_bk_exactly(grid.Case(name, module, torch.randn(shape)), "auto")


def test_sequence_bias_appended_token_is_exact_and_time_first_is_refused():
    """Opacus's SequenceBias appends a learned bias as the last token: example i's gradient
    is its output gradient there. Time-first, the output's dim 0 is the sequence: refused."""
    from opacus.layers import SequenceBias
    torch.manual_seed(5)
    _runs_bk_exactly(grid.Case("SequenceBias batch_first", SequenceBias(6, batch_first=True),
                               torch.randn(4, 3, 6)))
    reason = bk_unsupported(SequenceBias(6, batch_first=False))
    assert reason is not None and "time-first" in reason, reason


def test_scaled_std_conv_gain_alone_and_frozen_weight():
    """Only the gain trainable (the weight frozen): its gradient is scale <W_hat, G_eff>."""
    torch.manual_seed(4)
    conv = timm.layers.ScaledStdConv2d(3, 4, 3, bias=False)
    conv.weight.requires_grad_(False)
    with torch.no_grad():
        conv.gain.normal_(1.0, 0.3)
    _runs_bk_exactly(grid.Case("ScaledStdConv2d gain only", conv, torch.randn(3, 3, 6, 6)))
