"""The float64-reference comparison helper itself: it accepts float32 rounding, rejects errors."""

import pytest
import torch

from tests.helpers.numerics import (
    assert_matches_reference,
    assert_trajectory_matches,
    float64_batch,
    tolerance,
)


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


def test_a_trajectory_within_rounding_passes_and_a_wrong_step_is_named():
    g = torch.Generator().manual_seed(2)
    steps64 = [torch.randn(50, dtype=torch.float64, generator=g) for _ in range(5)]
    assert_trajectory_matches([s.float() for s in steps64], steps64)
    bad = [s.float() for s in steps64]
    bad[3] = bad[3] * 1.001
    with pytest.raises(AssertionError, match="step 4"):
        assert_trajectory_matches(bad, steps64)
    with pytest.raises(AssertionError, match="steps"):
        assert_trajectory_matches(bad[:4], steps64)


def test_float64_batch_casts_floating_tensors_only():
    x, y = float64_batch((torch.ones(2), torch.tensor([1, 2])))
    assert x.dtype == torch.float64 and y.dtype == torch.int64
    assert float64_batch([None, torch.ones(1)])[0] is None
