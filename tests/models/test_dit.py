"""DP-aware AdaLN-Zero DiT: the bounds hold, blocks start as the identity, Opacus is exact."""

from __future__ import annotations

import pytest
import torch
from opacus import GradSampleModule

from dpbench.models.dit import AdaLNZeroBlock, Bounds, TimeSeriesDiT
from tests.helpers.numerics import (
    assert_matches_reference,
    float64_batch,
    float64_copy,
    one_at_a_time_grads,
)

L, K, F = 6, 3, 5


def _inputs(n: int, scale: float = 1.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    values = scale * torch.randn(n, L, K, generator=g)
    target = (torch.rand(n, L, K, generator=g) < 0.3).float()
    cond_mask = 1 - target
    return (torch.randn(n, L, K, generator=g) * target, target,
            torch.randint(0, 10, (n,), generator=g), values * cond_mask, cond_mask,
            torch.rand(n, L, F, generator=g) - 0.5)


def _randomise(model: torch.nn.Module, std: float = 0.5) -> None:
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)


def test_condition_is_projected_onto_the_ball():
    model = TimeSeriesDiT(K, F, hidden=8, depth=1, heads=2, bounds=Bounds(True, c_max=0.7))
    _randomise(model)
    x = _inputs(16, scale=50.0)  # heterogeneous, large conditions
    with torch.no_grad():
        c = model.condition(x[2], x[3], x[4], x[5])
    norms = c.flatten(1).norm(dim=1)
    assert float(norms.max()) <= 0.7 * (1 + 1e-5)
    model.set_dp_aware(False)
    with torch.no_grad():
        assert float(model.condition(x[2], x[3], x[4], x[5]).flatten(1).norm(dim=1).max()) > 0.7


def test_project_leaves_small_conditions_unchanged():
    b = Bounds(True, c_max=10.0)
    c = torch.randn(4, 3, 2) * 0.1
    assert torch.equal(b.project(c), c)


def test_modulation_is_bounded_coordinatewise():
    bounds = Bounds(True, c_max=100.0, m_gamma=0.3, m_beta=0.5, m_alpha=0.2)
    block = AdaLNZeroBlock(8, 2, 2.0, bounds)
    _randomise(block, std=3.0)
    c = 20 * torch.randn(5, L, 8)
    with torch.no_grad():
        g1, b1, a1, g2, b2, a2 = block.modulations(c)
    for t, m in ((g1, 0.3), (g2, 0.3), (b1, 0.5), (b2, 0.5), (a1, 0.2), (a2, 0.2)):
        assert float(t.abs().max()) <= m * (1 + 1e-6)  # tanh saturates to 1.0 in float32
    bounds.enabled = False
    with torch.no_grad():
        raw = block.modulations(c)
    assert float(raw[0].abs().max()) > 0.3 and float(raw[2].abs().max()) > 0.2


@pytest.mark.parametrize("dp_aware", [False, True])
def test_fresh_block_and_model_are_identity_and_zero(dp_aware):
    torch.manual_seed(0)
    block = AdaLNZeroBlock(8, 2, 2.0, Bounds(dp_aware, c_max=1.0))
    h, c = torch.randn(3, L, 8), torch.randn(3, L, 8)
    assert torch.equal(block(h, c), h)
    model = TimeSeriesDiT(K, F, hidden=8, depth=2, heads=2, bounds=Bounds(dp_aware, c_max=1.0))
    assert torch.equal(model(*_inputs(3)), torch.zeros(3, L, K))


@pytest.mark.filterwarnings("ignore:Full backward hook")
@pytest.mark.parametrize("mode", ["hooks", "functorch"])
@pytest.mark.parametrize("dp_aware", [False, True])
def test_opacus_per_example_gradients_match_one_at_a_time(mode, dp_aware):
    model = TimeSeriesDiT(K, F, hidden=8, depth=2, heads=2,
                          bounds=Bounds(dp_aware, c_max=1.0, m_gamma=0.5, m_beta=0.5,
                                        m_alpha=0.5))
    _randomise(model, std=0.3)
    x = _inputs(4, scale=3.0)
    x64 = float64_batch(x)
    reference = one_at_a_time_grads(
        float64_copy(model), lambda m, i: m(*(t[i:i + 1] for t in x64)).pow(2).sum(), 4)
    gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum",
                           force_functorch=mode == "functorch")
    model.zero_grad()
    gsm(*x).pow(2).flatten(1).sum(dim=1).sum().backward()
    for j, (name, p) in enumerate(model.named_parameters()):
        expected = torch.stack([r[j] for r in reference])
        assert_matches_reference(p.grad_sample, expected, dtype=torch.float32,
                                 reduction=L * 4 * 8, per_row=True, name=name)
    gsm._close()


@pytest.mark.parametrize("m", [1.0, 0.4])
def test_one_shared_bound_squashes_the_joined_output_to_the_same_numbers(m):
    """With M_gamma = M_beta = M_alpha the six modulations are squashed in one op; the values
    and the gradients are bit-equal to squashing each chunk with its own M (eq. of the
    bounded modulation, M tanh(x / M))."""
    bounds = Bounds(True, c_max=100.0, m_gamma=m, m_beta=m, m_alpha=m)
    block = AdaLNZeroBlock(8, 2, 2.0, bounds)
    _randomise(block, std=3.0)
    c = 5 * torch.randn(5, L, 8)

    def per_chunk():
        g1, b1, a1, g2, b2, a2 = block.modulation(c).chunk(6, dim=-1)
        return [m * torch.tanh(t / m) for t in (g1, b1, a1, g2, b2, a2)]

    outputs, grads = [], []
    for fn in (lambda: list(block.modulations(c)), per_chunk):
        block.zero_grad()
        out = fn()
        sum((k + 1) * t.square().sum() for k, t in enumerate(out)).backward()
        outputs.append(out)
        grads.append([p.grad.clone() for p in block.modulation.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*outputs))
    assert all(torch.equal(a, b) for a, b in zip(*grads))
