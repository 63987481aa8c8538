"""The float64-reference comparison helper itself: it accepts float32 rounding, rejects errors."""

import pytest
import torch

from tests.numerics import assert_matches_reference, tolerance


def test_float32_matmul_is_within_tolerance_of_its_float64_reference():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, 512, dtype=torch.float64, generator=g)
    b = torch.randn(512, 32, dtype=torch.float64, generator=g)
    err = assert_matches_reference(a.float() @ b.float(), a @ b, reduction=512, per_row=True)
    assert err < tolerance(torch.float32, 512)


def test_a_wrong_row_is_caught_even_inside_a_large_total():
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(100, 10, dtype=torch.float64, generator=g)
    bad = ref.clone().float()
    bad[7] *= 1.001  # one example 0.1 % off: norm-wise on the whole tensor it is 1e-4
    with pytest.raises(AssertionError, match="row 7"):
        assert_matches_reference(bad, ref, per_row=True)


def test_the_reference_must_be_float64():
    with pytest.raises(TypeError, match="float64"):
        assert_matches_reference(torch.ones(3), torch.ones(3))
