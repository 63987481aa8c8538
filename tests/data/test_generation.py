"""Generation data: target-only labels, left-padded prompts, clear errors without `datasets`."""

from __future__ import annotations

import sys

import pytest

from dpbench.data.generation import build_e2e, build_sst2_gen
from dpbench.errors import DataError


def test_sst2_gen_labels_cover_the_target_only(shared_data):
    data = build_sst2_gen(root=shared_data, train_size=6, test_size=4, max_source_length=10,
                          max_target_length=3)
    ids, mask, labels = data.train.tensors
    assert ids.shape == (6, 14) and data.task == "text_generation"
    gen = data.extras["generation"]
    for i in range(6):
        target = labels[i][labels[i] != -100]
        text = gen["decode"](target[None])[0]
        assert text in ("positive", "negative")  # the eos ([SEP]) is skipped when decoding
        assert int(mask[i].sum()) == int((labels[i] != -100).nonzero().max()) + 1
    assert gen["prompt_ids"].shape == (4, 10) and bool(gen["prompt_mask"][:, -1].all())
    assert all(len(r) == 1 and r[0] in ("positive", "negative") for r in gen["references"])


def test_hub_generation_data_without_datasets_is_a_data_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(DataError, match="datasets"):
        build_e2e()
