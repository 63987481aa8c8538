"""DP-SGD's clipping: flat by default, normalised clip_C(g) / C on request."""

from __future__ import annotations

import pytest
import torch

from dpbench.methods.base import Mechanism, StepContext
from dpbench.methods.dpsgd import DPSGD

CTX = StepContext(step=0, epoch=0, private=True, noise_multiplier=1.0, clip_norm=2.0,
                  expected_batch_size=10.0, sample_rate=0.1, dataset_size=100, total_steps=1)
NORMS = torch.tensor([0.0, 0.5, 2.0, 8.0])


def test_default_is_the_base_flat_clipping():
    method = DPSGD.configured().halves()
    base = Mechanism("base", None)
    assert torch.equal(method.mechanism.clip_factors(NORMS, CTX), base.clip_factors(NORMS, CTX))
    assert method.mechanism.sensitivity(CTX) == 2.0


def test_normalised_clipping():
    method = DPSGD.configured(normalize=True).halves()
    contrib = method.mechanism.clip_factors(NORMS, CTX) * NORMS
    expected = torch.minimum(NORMS, torch.tensor(2.0)) / 2.0
    assert torch.allclose(contrib, expected, atol=1e-5)
    assert method.mechanism.sensitivity(CTX) == 1.0
    assert float(contrib.max()) == pytest.approx(1.0, abs=1e-5)
