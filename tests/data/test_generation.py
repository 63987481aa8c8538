"""Generation data: target-only labels, left-padded prompts, clear errors without `datasets`."""

from __future__ import annotations

import sys

import pytest

from dpbench.data.generation import build_dart, build_e2e, build_sst2_gen
from dpbench.errors import DataError
from tests.helpers.synthetic import dart_rows, e2e_rows, write_sst2


def test_sst2_gen_labels_cover_the_target_only(tmp_path):
    write_sst2(tmp_path, n_train=30, n_dev=10)
    data = build_sst2_gen(root=tmp_path, train_size=6, test_size=4, max_source_length=10,
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


class _FakeDatasets:
    """Stands in for Hugging Face ``datasets``: returns rows in the hub's schema."""

    def __init__(self, rows):
        self.rows, self.calls = rows, []

    def load_dataset(self, name, config=None, split=None):
        self.calls.append((name, config, split))
        return self.rows[split]


def test_e2e_rows_become_prompt_and_reference(monkeypatch):
    fake = _FakeDatasets({"train": e2e_rows(8), "test": e2e_rows(3)})
    monkeypatch.setitem(sys.modules, "datasets", fake)
    data = build_e2e(max_source_length=24, max_target_length=12)
    assert fake.calls == [("e2e_nlg", None, "train"), ("e2e_nlg", None, "test")]
    refs = data.extras["generation"]["references"]
    assert refs == [[r["human_reference"]] for r in e2e_rows(3)]
    assert len(data.train) == 8 and data.task == "text_generation"


def test_dart_keeps_every_reference_and_joins_the_triples(monkeypatch):
    fake = _FakeDatasets({"train": dart_rows(5), "test": dart_rows(2)})
    monkeypatch.setitem(sys.modules, "datasets", fake)
    data = build_dart(max_source_length=40, max_target_length=12)
    gen = data.extras["generation"]
    assert gen["references"][1] == ["Town 1 is in Ruritania.", "Town 1 lies on the Elbe."]
    prompt = gen["decode"](gen["prompt_ids"][:1])[0]
    assert "town 0 : country : ruritania | town 0 : river : elbe" in prompt
