"""The real data files under ``DPBENCH_DATA_ROOT``: checksums, split sizes, published counts.

Marked ``data``: left out of ``make test`` (which runs on synthetic files) and run by
``make test-data``, which fails, not skips, when ``DPBENCH_DATA_ROOT`` is unset. The root holds
the small offline copies (``mnist/``, ``fashion-mnist/``, ``cifar10/``, ``SST-2/``,
``ETT-small/``, ``adult/``, ``dutch/``, ``celeba/``).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest
import torch

from dpbench.data import get_dataset_builder
from dpbench.data.generation import build_sst2_gen
from dpbench.data.skewed import build_skewed_mnist
from dpbench.data.tabular import build_adult, build_celeba_attributes, build_dutch
from dpbench.data.text import build_glue
from dpbench.data.vision import build_cifar10, build_fashion_mnist, build_mnist

pytestmark = pytest.mark.data

#: sha256 of the published files (the offline copies are unmodified)
SHA256 = {
    "ETT-small/ETTh1.csv": "f18de3ad269cef59bb07b5438d79bb3042d3be49bdeecf01c1cd6d29695ee066",
    "ETT-small/ETTh2.csv": "a3dc2c597b9218c7ce1cd55eb77b283fd459a1d09d753063f944967dd6b9218b",
    "ETT-small/ETTm1.csv.gz": "73c18304514c26a5cddba02e6538513a0e23b2fbb59752535adbf541c9edc672",
    "ETT-small/ETTm2.csv.gz": "5122051efae7be24b40bedc80ee445bd18298552b940084f0dbe329c5157110a",
    "adult/adult.data": "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
    "adult/adult.test": "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
    "dutch/dutch_census_2001.arff":
        "0e7e3f32668919c239db820f625815e1ea834c71402cdea595e03ef08c8616ef",
    "mnist/t10k-images-idx3-ubyte.gz":
        "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "mnist/t10k-labels-idx1-ubyte.gz":
        "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
    "fashion-mnist/fashion-mnist_test.csv":
        "22439b30d46fac6757fd8931dc43ca5e2ab0268a9c6c74b8240fb7c915ac319c",
    "cifar10/cifar10-test-jpg.tar.gz":
        "a238e934008b86d60efef2ec900cff8afc7ce87b63e7bfd7936c29106ff76c74",
    "SST-2/train.tsv": "48eac26399f8456935f81dd9e3a745c1430adb6c62e233ccfe22db4a0d15d1d1",
    "SST-2/dev.tsv": "54a9c12c77e402fc14d6a66a506f24d999f596b0176eb777c972cccc2f9cc4b0",
    "celeba/list_attr_celeba.zip":
        "99462e0f98cfa18ae75d4d2e28fa48d8b4b3d4bc0bcf3c1e25b4987f71d78b1b",
    "celeba/list_eval_partition.txt":
        "fc955bcb3ef8fbdf7d5640d9a8693a8431b5f2ee291a5c1449a1549e7e073fe7",
}


@pytest.mark.parametrize("relative", sorted(SHA256))
def test_checksum(data_root, relative):
    path = data_root / relative
    assert path.is_file(), f"{path} is missing"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == SHA256[relative]


def test_mnist_test_set_counts_and_split(data_root):
    data = build_mnist(root=data_root, download=False)
    labels = torch.cat([data.train.tensors[1], data.test.tensors[1]])
    assert len(data.train) == 8000 and len(data.test) == 2000
    assert torch.bincount(labels, minlength=10).tolist() == [980, 1135, 1032, 1010, 982, 892,
                                                             958, 1028, 974, 1009]


def test_skewed_mnist_on_the_real_copy(data_root):
    base = build_mnist(root=data_root, download=False)
    skewed = build_skewed_mnist(root=data_root, download=False, skew_class=8,
                                keep_fraction=0.25)
    before = torch.bincount(base.train.tensors[1], minlength=10)
    after = torch.bincount(skewed.train.tensors[1], minlength=10)
    assert int(after[8]) == round(0.25 * int(before[8]))
    assert torch.equal(base.test.tensors[1], skewed.test.tensors[1])


def test_fashion_mnist_csv_cut_counts(data_root):
    data = build_fashion_mnist(root=data_root, download=False)
    labels = torch.cat([data.train.tensors[1], data.test.tensors[1]])
    assert torch.bincount(labels, minlength=10).tolist() == [108, 89, 99, 112, 114, 83, 106,
                                                             102, 96, 91]


def test_cifar10_test_jpegs_1000_per_class(data_root):
    data = build_cifar10(root=data_root, download=False)
    labels = torch.cat([data.train.tensors[1], data.test.tensors[1]])
    assert torch.bincount(labels, minlength=10).tolist() == [1000] * 10
    assert len(data.train) == 8000 and data.input_shape == (3, 32, 32)


def test_sst2_sizes_and_labels(data_root):
    data = build_glue("sst2", root=data_root, max_length=16, train_size=40, test_size=20)
    assert any("fixed subset of 40 of 67349" in n for n in data.notes)
    full_dev = build_glue("sst2", root=data_root, max_length=8, train_size=8)
    assert len(full_dev.test) == 872 and int(full_dev.test.tensors[2].sum()) == 444


def test_sst2_gen_on_the_real_copy(data_root):
    data = build_sst2_gen(root=data_root, train_size=6, test_size=4, max_source_length=10,
                          max_target_length=3)
    refs = data.extras["generation"]["references"]
    assert len(refs) == 4 and all(r[0] in ("positive", "negative") for r in refs)


def test_etth1_split_sizes_and_public_scaling(data_root):
    data = get_dataset_builder("etth1")(root=data_root, window=24, train_stride=24,
                                        test_stride=24)
    frame = pd.read_csv(data_root / "ETT-small" / "ETTh1.csv")
    assert len(frame) == 17420 and list(frame.columns)[0] == "date"
    val = frame.drop(columns="date").to_numpy(np.float32)[8640:11520]
    np.testing.assert_allclose(data.extras["loc"], val.mean(axis=0), rtol=1e-4, atol=1e-4)
    assert len(data.train) == 8640 // 24 and len(data.test) == (14400 - (11520 - 24)) // 24


def test_ettm1_gzip_sizes(data_root):
    data = get_dataset_builder("ettm1")(root=data_root, window=96, train_stride=96,
                                        test_stride=96, mode="forecast", horizon=24)
    assert len(data.train) == 34560 // 96 and len(data.test) == (11520 + 96) // 96


def test_adult_published_counts(data_root):
    data = build_adult(root=data_root)
    ytr, yte = data.train.tensors[1], data.test.tensors[1]
    assert len(ytr) == 32561 and int(ytr.sum()) == 7841
    assert len(yte) == 16281 and int(yte.sum()) == 3846


def test_dutch_published_counts(data_root):
    data = build_dutch(root=data_root)
    assert len(data.train) + len(data.test) == 60420
    assert int(data.train.tensors[1].sum() + data.test.tensors[1].sum()) == 28763
    assert data.test.tensors[2].float().mean().item() == pytest.approx(30273 / 60420, abs=0.02)


def test_celeba_official_partition_sizes(data_root):
    data = build_celeba_attributes(root=data_root)
    assert len(data.train) == 162770 and len(data.test) == 19962
    assert data.input_shape == (39,)
