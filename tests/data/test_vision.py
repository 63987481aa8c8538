"""Vision loaders on synthetic files in each layout they read: offline copies and torchvision's."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from dpbench.data.base import fixed_split
from dpbench.data.vision import (
    MNIST_MEAN,
    MNIST_STD,
    build_cifar10,
    build_fashion_mnist,
    build_mnist,
)
from dpbench.errors import DataError
from tests.helpers.synthetic import (
    digit_images,
    idx_bytes,
    write_cifar10_jpegs,
    write_fashion_csv,
    write_mnist_copy,
    write_torchvision_mnist,
)


def _pixels(x: torch.Tensor, mean: float, std: float) -> np.ndarray:
    return np.rint((x.squeeze(1).numpy() * std + mean) * 255).astype(np.int64)


def test_mnist_offline_copy_is_parsed_and_split_80_20(tmp_path):
    labels = write_mnist_copy(tmp_path, n=200)
    images, _ = digit_images(200)
    data = build_mnist(root=tmp_path, download=False)
    tr, te = fixed_split(200, 0.8)
    assert len(data.train) == 160 and len(data.test) == 40 and data.input_shape == (1, 28, 28)
    assert data.train.tensors[1].tolist() == labels[tr].tolist()
    assert data.test.tensors[1].tolist() == labels[te].tolist()
    # the pixels survive the IDX parse and the fixed public normalisation exactly
    assert np.array_equal(_pixels(data.train.tensors[0], MNIST_MEAN, MNIST_STD), images[tr])
    assert any("fixed 80% split" in note for note in data.notes)


def test_mnist_torchvision_layout_gives_the_official_split(tmp_path):
    ytr, yte = write_torchvision_mnist(tmp_path, n_train=120, n_test=40)
    data = build_mnist(root=tmp_path, download=False, train_subset=50)
    assert len(data.test) == 40 and data.test.tensors[1].tolist() == yte.tolist()
    assert len(data.train) == 50 and set(data.train.tensors[1].tolist()) <= set(ytr.tolist())
    assert not any("80% split" in note for note in data.notes)


def test_fashion_mnist_csv_cut_and_torchvision_layout(tmp_path):
    labels = write_fashion_csv(tmp_path, n=100)
    data = build_fashion_mnist(root=tmp_path, download=False)
    tr, _ = fixed_split(100, 0.8)
    assert data.train.tensors[1].tolist() == labels[tr].tolist()
    assert data.class_names[9] == "Ankle boot" and data.input_shape == (1, 28, 28)
    other = tmp_path / "tv"
    _, yte = write_torchvision_mnist(other, n_train=30, n_test=20, folder="FashionMNIST")
    official = build_fashion_mnist(root=other, download=False)
    assert official.test.tensors[1].tolist() == yte.tolist() and len(official.train) == 30


def test_cifar10_test_jpegs_are_read_with_folder_labels(tmp_path):
    labels = write_cifar10_jpegs(tmp_path, per_class=3)
    data = build_cifar10(root=tmp_path, download=False)
    tr, te = fixed_split(30, 0.8)
    assert data.input_shape == (3, 32, 32) and data.num_classes == 10
    assert data.train.tensors[1].tolist() == labels[tr].tolist()
    assert data.test.tensors[1].tolist() == labels[te].tolist()


def test_mismatched_image_and_label_counts_and_missing_root(tmp_path):
    write_mnist_copy(tmp_path, n=50)
    _, labels = digit_images(40)
    (tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz").write_bytes(
        gzip.compress(idx_bytes(labels)))
    with pytest.raises(DataError, match="50 images but 40 labels"):
        build_mnist(root=tmp_path, download=False)
    with pytest.raises(DataError, match="paths.data_root"):
        build_mnist(root=tmp_path / "empty", download=False)
