"""Regression tests: the configurations the engines got silently wrong are exact or refused.

Built on the real third-party classes (loralib, timm) and faithful local copies otherwise
(``tests/helpers/engine_grid.py``): subclasses with their own forward or parameters,
old-style weight/spectral norm, layers whose dim 0 is not the example, a weight used outside
its layer, layers called twice, in-place outputs; Opacus hooks on channels_last inputs,
``scale_grad_by_freq`` and attention with ``add_bias_kv``. Each is run as the loop runs it
(the engine chosen and checked before any release) against a float64 reference.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpbench.errors import ConfigError
from dpbench.training.engine.bookkeeping import bk_unsupported
from dpbench.training.engine.rules import rule_for
from tests.helpers import engine_grid as grid
from tests.helpers.engines import ONE_POINT
from tests.helpers.grid_checks import assert_exact as _assert_exact
from tests.helpers.grid_checks import assert_neighbours as _assert_neighbours

pytest.importorskip("loralib")
pytest.importorskip("timm")

SPECIAL = {case.name.split(" N=")[0]: case for case in grid.special_cases(grid.RandomDraw(3))}
#: where an exact engine exists, auto must run on it (the engine it must pick)
AUTO_RUNS = {
    "Linear subclass using 2W": "hooks", "parametrizations.weight_norm Linear": "hooks",
    "Linear called twice": "bk", "Conv2d called twice": "hooks",
    "LayerNorm called twice": "hooks", "Embedding called twice": "hooks",
    "loralib.Linear": "hooks",
    "loralib.MergedLinear": "hooks", "loralib.Embedding": "hooks",
    # book-keeping's own rules: LayerNorm2d's channel normalisation, weight standardisation
    "timm.LayerNorm2d": "bk", "timm.StdConv2d": "bk", "timm.ScaledStdConv2d": "bk",
    "timm.Conv2dSame": "hooks",
}
#: no engine computes these exactly with the example on dim 0: every mode refuses
REFUSED = ("old-style weight_norm Linear", "old-style spectral_norm Linear",
           "old-style weight_norm Conv2d", "time-first Linear", "time-first Embedding",
           "folded emb(x.reshape(-1))", "folded Linear [N*T]",
           "augmentation multiplicity [N*K]", "tied F.linear(h, emb.weight)",
           "in-place ReLU after Linear")


def _case(prefix: str) -> grid.Case:
    matches = [c for k, c in SPECIAL.items() if k.startswith(prefix)]
    assert matches, prefix
    return matches[0]


@pytest.mark.parametrize("prefix", list(AUTO_RUNS))
def test_auto_runs_the_exact_engine(prefix):
    case = _case(prefix)
    run = grid.run_case(case, "auto")
    _assert_exact(run, case.name)
    assert run.engine == AUTO_RUNS[prefix], run.engine
    _assert_neighbours(case, run)
    if AUTO_RUNS[prefix] != "bk":
        assert grid.run_case(case, "bk").status == "refused"


@pytest.mark.parametrize("prefix", REFUSED)
@pytest.mark.parametrize("mode", ["bk", "hooks", "functorch", "ghost", "auto"])
def test_no_exact_engine_means_refused(prefix, mode):
    run = grid.run_case(_case(prefix), mode)
    assert run.status == "refused", f"{prefix} [{mode}]: {run.status} {run.engine}"


def test_rules_apply_to_subclasses_only_with_the_base_forward_and_parameters():
    import loralib
    from timm.layers import LayerNorm2d, StdConv2d
    from timm.layers.conv2d_same import Conv2dSame

    class SameForward(nn.Linear):  # a subclass that changes nothing: still the rule
        pass

    class OwnStdConv(StdConv2d):  # a named rule's class is matched exactly, not by name
        def forward(self, x):
            return super().forward(2 * x)

    class LayerNorm2dWithShift(LayerNorm2d):  # the rule's parameters only
        def __init__(self, c: int) -> None:
            super().__init__(c)
            self.shift = nn.Parameter(torch.zeros(c))

    assert rule_for(SameForward(2, 2)) is not None
    assert rule_for(LayerNorm2d(3)) is not None and rule_for(StdConv2d(3, 4, 3)) is not None
    for layer in (grid.DoubledLinear(2, 2), loralib.Linear(4, 4, r=2), OwnStdConv(3, 4, 3),
                  LayerNorm2dWithShift(3), Conv2dSame(3, 4, 3), loralib.Embedding(5, 4, r=2)):
        reason = bk_unsupported(nn.Sequential(layer))
        assert reason is not None and type(layer).__name__ in reason, reason
    weight_normed = nn.utils.weight_norm(nn.Linear(3, 2))
    assert "weight_g" in bk_unsupported(nn.Sequential(weight_normed))


def test_bk_refuses_a_layer_whose_dim_0_is_not_the_example_by_name():
    from dpbench.training.engine.bookkeeping import BookKeepingEngine
    model = grid.TimeFirst(nn.Linear(4, 2))
    engine = BookKeepingEngine(model)
    x, r = torch.randn(3, 5, 4), torch.randn(3, 5, 2)
    with pytest.raises(ConfigError, match=r"layer 'layer' sees a leading size of 5, not the 3"):
        engine.clipped_sum(grid.loss_fn, (x, r), ONE_POINT, torch.ones_like)


def test_hooks_on_channels_last_conv_is_refused_and_auto_runs_bk():
    case = grid.Case("channels_last conv", grid.ChannelsLast(nn.Conv2d(32, 16, 3, groups=4)),
                     torch.randn(2, 32, 11, 11))
    hooks = grid.run_case(case, "hooks")
    assert hooks.status == "refused" or hooks.status == "ran"
    if hooks.status == "ran":  # exact when Opacus handles the layout
        _assert_exact(hooks, case.name)
    auto = grid.run_case(case, "auto")
    assert auto.engine == "bk"
    _assert_exact(auto, case.name)


def test_embedding_scale_grad_by_freq_is_refused():
    emb = nn.Embedding(6, 4, scale_grad_by_freq=True)
    case = grid.Case("scale_grad_by_freq", emb, torch.tensor([[1, 1, 2], [3, 1, 1]]))
    for mode in ("bk", "hooks", "auto"):
        run = grid.run_case(case, mode)
        assert run.status == "refused", f"{mode}: {run.status} {run.engine}"


def test_attention_with_add_bias_kv_is_refused_not_crashed():
    attn = nn.MultiheadAttention(4, 2, add_bias_kv=True, batch_first=True)
    with torch.no_grad():
        attn.bias_k.normal_()
        attn.bias_v.normal_()
    case = grid.Case("add_bias_kv", grid.AttentionModel(attn, True), torch.randn(3, 6, 4))
    for mode in ("hooks", "auto"):
        run = grid.run_case(case, mode)
        assert run.status in ("refused", "ran"), f"{mode}: {run.status} {run.engine}"
        if run.status == "ran":
            _assert_exact(run, f"add_bias_kv [{mode}]")
