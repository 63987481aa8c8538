"""BandMF's strategy math against dense linear algebra and the closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpbench.privacy.banded_mf import (
    BandedNoiseShaper,
    amplified_equivalent,
    inverse_coefficients,
    optimal_coefficients,
    prefix_sum_loss,
    sqrt_coefficients,
    toeplitz_matrix,
)


@pytest.mark.parametrize("strategy", ["sqrt", "optimal"])
@pytest.mark.parametrize("bands", [1, 2, 5])
def test_unit_norm_and_inverse_equals_dense_solve(strategy, bands):
    n = 12
    c = sqrt_coefficients(bands) if strategy == "sqrt" else optimal_coefficients(bands, n)
    assert np.linalg.norm(c) == pytest.approx(1.0, abs=1e-12)
    dense = toeplitz_matrix(c, n)
    assert np.linalg.norm(dense, axis=0).max() == pytest.approx(1.0, abs=1e-12)
    assert np.allclose(np.tril(dense, -bands), 0.0)  # b-banded
    inverse = np.linalg.inv(dense)
    assert np.allclose(toeplitz_matrix(inverse_coefficients(c, n), n), inverse, atol=1e-10)
    workload = np.tril(np.ones((n, n)))
    assert prefix_sum_loss(c, n) == pytest.approx(np.linalg.norm(workload @ inverse) ** 2,
                                                  rel=1e-10)


def test_sqrt_coefficients_are_the_closed_form_square_root():
    n = 9
    c = np.array([math.comb(2 * k, k) / 4**k for k in range(n)])  # binom(2k, k) / 4^k
    full = toeplitz_matrix(c, n)
    assert np.allclose(full @ full, np.tril(np.ones((n, n))), atol=1e-12)  # C C = A
    assert np.allclose(sqrt_coefficients(4), c[:4] / np.linalg.norm(c[:4]))


@pytest.mark.parametrize(("bands", "n", "gain"), [
    (2, 30, 1.0), (4, 62, 1.05), (2, 1200, 1.08), (4, 1200, 1.15), (32, 2000, 1.2)])
def test_optimised_beats_or_equals_the_closed_form(bands, n, gain):
    """Optimised <= closed form, by at least ``gain`` where measured (fixed problems)."""
    optimised = prefix_sum_loss(optimal_coefficients(bands, n), n)
    closed = prefix_sum_loss(sqrt_coefficients(bands), n)
    assert optimised * gain <= closed * (1 + 1e-12)
    # no better bands-b Toeplitz strategy among nearby unit vectors (a local optimum)
    c = optimal_coefficients(bands, n)
    rng = np.random.default_rng(0)
    for _ in range(20):
        near = c + 1e-3 * rng.standard_normal(bands)
        assert prefix_sum_loss(near / np.linalg.norm(near), n) >= optimised * (1 - 1e-9)
    dpsgd = prefix_sum_loss(np.ones(1), n)
    assert closed < dpsgd  # correlated noise helps the prefix sums at all


def test_noise_recursion_equals_dense_inverse_with_column_normalisation():
    bands, n = 3, 7
    c = sqrt_coefficients(bands)
    z = torch.randn(n, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    shaper = BandedNoiseShaper(c, total_steps=n)
    got = torch.stack([shaper([z[t]])[0] for t in range(n)])
    strategy = toeplitz_matrix(c, n)
    strategy = strategy / np.linalg.norm(strategy, axis=0)  # unit-norm columns of the n x n C
    assert np.allclose(np.linalg.norm(strategy, axis=0), 1.0)
    expected = np.linalg.solve(strategy, z.numpy())
    assert np.allclose(got.numpy(), expected, atol=1e-12)


def test_noise_shaper_resumes_from_its_state():
    c = sqrt_coefficients(4)
    gen = torch.Generator().manual_seed(1)
    zs = [[torch.randn(3, generator=gen)] for _ in range(10)]
    straight = BandedNoiseShaper(c, total_steps=10)
    expected = [straight(z)[0] for z in zs]
    first = BandedNoiseShaper(c, total_steps=10)
    for z in zs[:6]:
        first(z)
    resumed = BandedNoiseShaper(c, total_steps=10)
    resumed.load_state_dict(first.state_dict())
    for z, want in zip(zs[6:], expected[6:]):
        assert torch.equal(resumed(z)[0], want)


def test_one_band_is_the_identity():
    z = [torch.randn(5), torch.randn(2, 2)]
    out = BandedNoiseShaper(sqrt_coefficients(1), total_steps=3)(z)
    assert all(a is b or torch.equal(a, b) for a, b in zip(out, z))


def test_amplified_equivalent():
    assert amplified_equivalent(0.01, 100, 1) == (0.01, 100)
    rate, steps = amplified_equivalent(0.01, 101, 4)
    assert rate == pytest.approx(0.04) and steps == 26
