"""CIFAR-100 has no offline copy: a missing data set is a clear DataError, never a hang."""

from __future__ import annotations

import pytest

from dpbench.data.cifar100 import build_cifar100
from dpbench.errors import DataError


def test_missing_cifar100_without_download_names_the_folder(tmp_path):
    with pytest.raises(DataError, match="cifar-100-python"):
        build_cifar100(root=tmp_path, download=False)
