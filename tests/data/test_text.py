"""GLUE text data: the offline SST-2 copy, fixed subsets, fixed tokenisation, clear errors."""

from __future__ import annotations

import sys

import pytest
import torch

from dpbench.data.text import build_glue
from dpbench.errors import DataError
from tests.helpers.synthetic import write_mnli, write_qnli, write_sst2


def test_sst2_subset_is_fixed_and_tokenised(tmp_path):
    train_labels, dev_labels = write_sst2(tmp_path, n_train=120, n_dev=40)
    data = build_glue("sst2", root=tmp_path, max_length=16, train_size=40, test_size=20)
    again = build_glue("sst2", root=tmp_path, max_length=16, train_size=40, test_size=20)
    assert data.task == "text_classification" and data.num_classes == 2
    ids, mask, y = data.train.tensors
    assert ids.shape == mask.shape == (40, 16) and y.shape == (40,)
    assert len(data.test) == 20
    assert set(y.tolist()) <= {0, 1} and 0 < y.sum() < 40
    assert torch.equal(ids, again.train.tensors[0])  # the same subset and tokens every time
    assert (ids[:, 0] == 101).all()  # [CLS] of MiniLM's fixed BERT vocabulary
    assert any("fixed subset of 40 of 120" in n for n in data.notes)
    full = build_glue("sst2", root=tmp_path, max_length=16)
    assert full.train.tensors[2].tolist() == train_labels  # dev.tsv is the test split
    assert full.test.tensors[2].tolist() == dev_labels


@pytest.mark.parametrize("task, writer, classes", [("qnli", write_qnli, 2),
                                                   ("mnli", write_mnli, 3)])
def test_sentence_pair_tasks_read_both_columns_and_string_labels(tmp_path, task, writer,
                                                                 classes):
    from dpbench.data.text import GLUE

    train_labels, dev_labels = writer(tmp_path, n_train=30, n_dev=12)
    data = build_glue(task, root=tmp_path, max_length=32)
    spec = GLUE[task]
    assert data.num_classes == classes
    assert data.train.tensors[2].tolist() == [spec.labels.index(v) for v in train_labels]
    assert data.test.tensors[2].tolist() == [spec.labels.index(v) for v in dev_labels]
    ids = data.train.tensors[0]
    assert ((ids == 102).sum(dim=1) == 2).all()  # two segments: [SEP] after each sentence


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
