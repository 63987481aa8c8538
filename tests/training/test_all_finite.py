"""The update's finiteness check (one inf-norm over every tensor) agrees with checking each
tensor, on NaN, +-inf, the largest float32, mixed dtypes, integer and empty tensors."""

from __future__ import annotations

import pytest
import torch

from dpbench.training.step import all_finite

BIG = torch.finfo(torch.float32).max
NAN, INF = float("nan"), float("inf")

CASES = {
    "finite": [torch.randn(3, 4), torch.randn(5)],
    "nan last": [torch.randn(3, 4), torch.tensor([1.0, NAN])],
    "nan first": [torch.tensor([NAN]), torch.randn(5)],
    "inf": [torch.randn(3), torch.tensor([INF])],
    "-inf": [torch.tensor([-INF, 1.0])],
    "largest float32": [torch.full((1000,), BIG), torch.full((10,), -BIG)],  # no overflow
    "bf16 and float64": [torch.randn(3, dtype=torch.bfloat16),
                         torch.randn(3, dtype=torch.float64)],
    "bf16 nan": [torch.tensor([NAN], dtype=torch.bfloat16), torch.randn(3, dtype=torch.float64)],
    "integer and empty": [torch.arange(3), torch.zeros(0)],
    "0-d nan": [torch.tensor(NAN)],
    "complex nan": [torch.tensor([complex(1.0, NAN)])],
    "none": [],
}


@pytest.mark.parametrize("name", list(CASES))
def test_all_finite_equals_the_check_of_each_tensor(name):
    tensors = CASES[name]
    reference = all(bool(torch.isfinite(t).all()) for t in tensors)
    assert all_finite(tensors) is reference
    assert all_finite(tensors[:1], tensors[1:]) is reference  # across groups alike
