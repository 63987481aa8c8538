"""Skewed MNIST: the requested class counts in training, an untouched test set."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpbench.data.skewed import build_skewed_mnist, skew_indices
from dpbench.data.vision import build_mnist
from dpbench.errors import ConfigError
from tests.helpers.synthetic import write_mnist_copy


def test_skew_indices_counts():
    labels = np.repeat(np.arange(10), 50)
    idx = skew_indices(labels, 3, 0.2)
    kept = np.bincount(labels[idx], minlength=10)
    assert kept[3] == 10 and all(kept[c] == 50 for c in range(10) if c != 3)


def test_skewed_mnist_counts_and_untouched_test(tmp_path):
    write_mnist_copy(tmp_path, n=400)
    base = build_mnist(root=tmp_path, download=False)
    skewed = build_skewed_mnist(root=tmp_path, download=False, skew_class=8,
                                keep_fraction=0.25)
    yb, ys = base.train.tensors[1], skewed.train.tensors[1]
    before, after = torch.bincount(yb, minlength=10), torch.bincount(ys, minlength=10)
    assert int(after[8]) == round(0.25 * int(before[8]))
    assert torch.equal(torch.cat([before[:8], before[9:]]), torch.cat([after[:8], after[9:]]))
    for a, b in zip(base.test.tensors, skewed.test.tensors):
        assert torch.equal(a, b)  # the test set is untouched
    # the skewed set is exactly the unskewed rows the fixed index selects
    idx = torch.from_numpy(skew_indices(yb.numpy(), 8, 0.25))
    assert torch.equal(skewed.train.tensors[0], base.train.tensors[0][idx])


@pytest.mark.parametrize("kw", [{"keep_fraction": 0.0}, {"keep_fraction": 1.5},
                                {"skew_class": 10}])
def test_bad_settings_rejected(kw):
    with pytest.raises(ConfigError):
        build_skewed_mnist(root=None, **kw)
