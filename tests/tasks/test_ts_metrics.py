"""Time-series metrics against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from dpbench.tasks.ts_metrics import (
    acf_distance,
    autocorrelation,
    crps_empirical,
    js_divergence,
    point_metrics,
)


def test_point_metrics_by_hand():
    y = torch.tensor([[2.0, -4.0, 0.001, 10.0]])
    pred = torch.tensor([[3.0, -1.0, 5.0, 10.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last entry is not a target
    m = point_metrics(pred, y, mask, mape_eps=0.01)
    assert m["rmse"] == pytest.approx(math.sqrt((1 + 9 + 4.999 ** 2) / 3), rel=1e-5)
    assert m["mae"] == pytest.approx((1 + 3 + 4.999) / 3, rel=1e-5)
    assert m["mape"] == pytest.approx((1 / 2 + 3 / 4) / 2 * 100, rel=1e-5)  # |y| <= eps skipped


def test_crps_of_two_samples_by_hand():
    # samples {0, 2}, y = 1: E|X - y| = 1, E|X - X'| = (0 + 2 + 2 + 0) / 4 = 1 -> 0.5
    # samples {0, 2}, y = 3: E|X - y| = 2 -> 1.5
    samples = torch.tensor([[0.0, 0.0], [2.0, 2.0]])
    y = torch.tensor([1.0, 3.0])
    out = crps_empirical(samples, y, torch.ones(2))
    assert out["crps"] == pytest.approx(1.0)
    assert out["crps_normalized"] == pytest.approx((0.5 + 1.5) / 4)
    one = crps_empirical(torch.tensor([[4.0]]), torch.tensor([1.0]), torch.ones(1))
    assert one["crps"] == pytest.approx(3.0)  # a point forecast: CRPS = |x - y|


def test_js_divergence_bounds():
    a = torch.tensor([0.0, 0.1, 0.2, 0.3])
    assert js_divergence(a, a.clone(), bins=4) == pytest.approx(0.0, abs=1e-12)
    assert js_divergence(a, a + 10.0, bins=10) == pytest.approx(1.0)  # disjoint supports
    # P = (1/2, 1/2, 0), Q = (0, 1/2, 1/2) on 3 bins: JS = 0.5 bit
    p = torch.tensor([0.0, 1.0])
    q = torch.tensor([1.0, 2.0])
    assert js_divergence(p, q, bins=3) == pytest.approx(0.5)


def test_autocorrelation_by_hand():
    x = torch.tensor([1.0, -1.0, 1.0, -1.0]).view(1, 4, 1)
    acf = autocorrelation(x, 2)
    assert acf[0, :, 0].tolist() == pytest.approx([-0.75, 0.5])
    assert acf_distance(x, x) == 0.0
    flat = torch.tensor([1.0, 1.0, 1.0, 1.0]).view(1, 4, 1)
    assert acf_distance(flat, x, max_lag=2) == pytest.approx((0.75 + 0.5) / 2)
