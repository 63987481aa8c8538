"""CIFAR-100 has no offline copy: a missing data set is a clear DataError, never a hang."""

from __future__ import annotations

import pytest

from dpbench.data.cifar100 import build_cifar100
from dpbench.errors import DataError


def test_missing_cifar100_without_download_names_the_folder(tmp_path):
    with pytest.raises(DataError, match="cifar-100-python"):
        build_cifar100(root=tmp_path, download=False)


def _write_cifar100(folder, protocol=2, n_train=20, n_test=10):
    import pickle

    import numpy as np

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("test", n_test)):
        batch = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 "fine_labels": rng.integers(0, 100, n).tolist(),
                 "coarse_labels": rng.integers(0, 20, n).tolist()}
        (folder / split).write_bytes(pickle.dumps(batch, protocol=protocol))
    names = [f"class{i}" for i in range(100)]
    (folder / "meta").write_bytes(pickle.dumps({"fine_label_names": names},
                                                  protocol=protocol))


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar100_batches_are_read_without_pickle_code(tmp_path, protocol):
    _write_cifar100(tmp_path / "cifar-100-python", protocol)
    data = build_cifar100(root=tmp_path, download=False)
    assert len(data.train) == 20 and len(data.test) == 10
    assert data.train[0][0].shape == (3, 32, 32) and data.class_names[3] == "class3"


class _Payload:
    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_cifar100_file_with_a_pickle_payload_is_refused_and_does_not_run(tmp_path):
    import pickle

    folder = tmp_path / "cifar-100-python"
    _write_cifar100(folder)
    marker = tmp_path / "payload-ran"
    (folder / "train").write_bytes(pickle.dumps({"data": _Payload(marker), "fine_labels": []}))
    with pytest.raises(DataError, match="refusing to unpickle"):
        build_cifar100(root=tmp_path, download=False)
    assert not marker.exists()
