"""GLUE text data: the offline SST-2 copy, fixed subsets, fixed tokenisation, clear errors."""

from __future__ import annotations

import sys

import pytest
import torch

from dpbench.data.text import build_glue
from dpbench.errors import DataError


def test_sst2_subset_is_fixed_and_tokenised(shared_data):
    data = build_glue("sst2", root=shared_data, max_length=16, train_size=40, test_size=20)
    again = build_glue("sst2", root=shared_data, max_length=16, train_size=40, test_size=20)
    assert data.task == "text_classification" and data.num_classes == 2
    ids, mask, y = data.train.tensors
    assert ids.shape == mask.shape == (40, 16) and y.shape == (40,)
    assert len(data.test) == 20
    assert set(y.tolist()) <= {0, 1} and 0 < y.sum() < 40
    assert torch.equal(ids, again.train.tensors[0])  # the same subset and tokens every time
    assert (ids[:, 0] == 101).all()  # [CLS] of MiniLM's fixed BERT vocabulary
    assert any("fixed subset of 40 of 67349" in n for n in data.notes)


def test_corrupt_tsv_and_missing_data_raise_data_error(tmp_path, monkeypatch):
    folder = tmp_path / "SST-2"
    folder.mkdir()
    (folder / "train.tsv").write_text("sentence\tlabel\ngood film \tpositive\n")
    (folder / "dev.tsv").write_text("sentence\tlabel\nbad \t0\n")
    with pytest.raises(DataError, match="corrupt"):
        build_glue("sst2", root=tmp_path)
    monkeypatch.setitem(sys.modules, "datasets", None)  # as on a machine without `datasets`
    with pytest.raises(DataError, match="paths.data_root"):
        build_glue("qnli", root=tmp_path)
