"""Book-keeping clipping equals Opacus hooks (materialised per-example gradients, clipped and
summed) on every model in the registry, layer rule by layer rule, and handles NaN examples."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpbench.errors import ConfigError
from dpbench.models import model_names
from dpbench.training.engine.bookkeeping import BookKeepingEngine, bk_unsupported
from dpbench.training.engine.materialised import flat_norms
from tests.helpers.bk_cases import (
    CLIP,
    _ce,
    bk_clipped_sum,
    hooks_reference,
    tiny_case,
)
from tests.helpers.engines import ONE_POINT
from tests.helpers.numerics import assert_matches_reference, float64_batch, float64_copy

#: the longest inner product behind a gradient entry in these tiny cases (a tolerance input)
REDUCTION = 256


def _reference_loop(model, loss_fn, batch):
    """Return the clipped sum and norms from plain autograd, one example at a time.

    The reference for single layers: Opacus hooks give a non-zero gradient to an
    Embedding's padding row and ignore a Conv2d's non-zero padding_mode (checked below).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    x, y = batch
    per = []
    for i in range(x.shape[0]):
        loss = loss_fn(model, (x[i:i + 1], None if y is None else y[i:i + 1])).sum()
        per.append(torch.autograd.grad(loss, params))
    grads = [torch.stack(g) for g in zip(*per)]
    norms = flat_norms(grads)
    factors = (CLIP / (norms + 1e-6)).clamp(max=1.0)
    return [torch.einsum("i,i...->...", factors, g) for g in grads], norms


def _assert_close(sums, ref):
    """Each float32 clipped sum equals its float64 reference, norm-wise (helpers/numerics.py)."""
    for j, (s, r) in enumerate(zip(sums, ref)):
        assert_matches_reference(s, r, dtype=torch.float32, reduction=REDUCTION,
                                 name=f"sum {j}")


def _assert_norms_close(norms, ref_norms):
    assert_matches_reference(norms, ref_norms, dtype=torch.float32, reduction=REDUCTION,
                             per_row=True, name="norms")


#: registry models that cannot be built offline: roberta_lora is the hub's RoBERTa with the
#: same peft LoRA linears as minilm_lora (checked above)
NEEDS_HUB = {"roberta_lora"}


@pytest.mark.parametrize("name", [n for n in model_names() if n not in NEEDS_HUB])
def test_bk_clipped_sum_equals_hooks(name):
    model, loss_fn, batch = tiny_case(name)
    # the reference: Opacus hooks on the model in float64
    ref_sums, ref_norms = hooks_reference(float64_copy(model), loss_fn, float64_batch(batch))
    sums, norms, factors = bk_clipped_sum(model, loss_fn, batch)
    _assert_norms_close(norms, ref_norms)
    assert float((factors < 1).float().mean()) > 0.5  # the clipping is active
    _assert_close(sums, ref_sums)
    assert all(p.grad is None for p in model.parameters())  # no parameter gradient formed


def _custom(module: nn.Module, x: torch.Tensor):
    """Return (model, loss_fn, batch) with ``module`` between two linear layers."""
    torch.manual_seed(1)
    return module, (lambda m, batch: m(batch[0]).flatten(1).tanh().pow(2).sum(1)), (x, None)


def _assert_bk_matches_reference(model, loss_fn, batch) -> None:
    """bk's per-example norms and clipped sums equal one-example-at-a-time autograd."""
    ref, ref_norms = _reference_loop(float64_copy(model), loss_fn, float64_batch(batch))
    sums, norms, _ = bk_clipped_sum(model, loss_fn, batch)
    _assert_norms_close(norms, ref_norms)
    _assert_close(sums, ref)


@pytest.mark.parametrize("module,x", [
    # grouped, dilated, strided conv with bias (instantiation branch) and with long L (ghost)
    (nn.Conv2d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2), torch.randn(4, 4, 9, 9)),
    (nn.Conv2d(3, 64, 3, padding="same", padding_mode="reflect"), torch.randn(4, 3, 4, 4)),
    (nn.Sequential(nn.Conv2d(64, 64, 2), nn.Flatten()), torch.randn(3, 64, 3, 3)),
    # a ResNet-sized layer: one torch weight-gradient call per example
    (nn.Conv2d(64, 64, 3, padding=1, bias=True), torch.randn(3, 64, 16, 16)),
    # sequence linear in both branches (T small: ghost, T large: instantiation)
    (nn.Linear(16, 16), torch.randn(4, 3, 16)),
    (nn.Linear(3, 2), torch.randn(4, 50, 3)),
    (nn.LayerNorm(6), torch.randn(4, 3, 6)),
    (nn.GroupNorm(2, 4), torch.randn(4, 4, 3, 3)),
])
def test_bk_layer_rules_equal_hooks(module, x):
    model, loss_fn, batch = _custom(module, x)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    _assert_bk_matches_reference(model, loss_fn, batch)


def test_bk_embedding_with_repeats_and_padding():
    torch.manual_seed(2)
    emb = nn.Embedding(7, 4, padding_idx=0)
    model = nn.Sequential(emb, nn.Flatten(), nn.Linear(20, 3))
    ids = torch.tensor([[1, 1, 2, 0, 1], [3, 4, 5, 6, 0], [2, 2, 2, 2, 2]])
    batch = (ids, torch.tensor([0, 1, 2]))
    _assert_bk_matches_reference(model, _ce, batch)


def test_bk_layer_called_twice_sums_both_calls():
    torch.manual_seed(3)
    lin = nn.Linear(4, 4)

    def loss_fn(m, batch):  # the same layer twice: G_i sums both calls' terms
        return m(torch.tanh(m(batch[0]))).pow(2).sum(1)

    batch = (torch.randn(6, 4), None)
    _assert_bk_matches_reference(lin, loss_fn, batch)


def test_bk_nonfinite_example_contributes_zero():
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    clean_sums, _ = _reference_loop(float64_copy(model), _ce, (x[1:].double(), y[1:]))
    x[0, 0] = float("nan")
    engine = BookKeepingEngine(model)
    _, norms, _, losses, kept = engine.clipped_sum(_ce, (x, y), ONE_POINT, torch.ones_like)
    assert kept.tolist() == [False, True, True, True] and norms[0] == 0 and len(losses) == 3
    sums, norms, factors = bk_clipped_sum(model, _ce, (x, y))
    assert factors[0] == 0 and all(bool(torch.isfinite(s).all()) for s in sums)
    _assert_close(sums, clean_sums)
    x[0, 0] = float("inf")  # finite loss is not guaranteed either way: still exactly excluded
    sums, _, factors = bk_clipped_sum(model, _ce, (x, y))
    assert factors[0] == 0
    _assert_close(sums, clean_sums)


def test_bk_refuses_unsupported_layer_by_name():
    model = nn.Sequential(nn.Linear(3, 3), nn.PReLU())
    assert "PReLU" in bk_unsupported(model) and "'1'" in bk_unsupported(model)
    with pytest.raises(ConfigError, match="PReLU"):
        BookKeepingEngine(model)
