"""Tabular loaders: fixed schema encodings, published label counts, protected groups."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpbench.data.tabular import (
    ADULT_CATEGORIES,
    ADULT_NUMERIC,
    build_adult,
    build_celeba_attributes,
    build_dutch,
    one_hot,
    scale_fixed,
)
from dpbench.errors import ConfigError
from tests.helpers.synthetic import write_adult, write_celeba, write_dutch


def test_one_hot_is_fixed_by_the_schema_not_the_data():
    cats = {"c": ["a", "b", "z"]}
    block = one_hot(pd.DataFrame({"c": ["b", "b", None, "q"]}), cats)
    assert block.tolist() == [[0, 1, 0], [0, 1, 0], [0, 0, 0], [0, 0, 0]]
    # a different sample of rows gets the same columns (nothing learned from data)
    assert one_hot(pd.DataFrame({"c": ["z"]}), cats).tolist() == [[0, 0, 1]]


def test_scale_fixed_uses_published_ranges():
    frame = pd.DataFrame({"age": [17, 90, 200], "hours-per-week": [1, 50, 99]})
    out = scale_fixed(frame, {"age": ADULT_NUMERIC["age"],
                              "hours-per-week": ADULT_NUMERIC["hours-per-week"]})
    assert np.allclose(out[:, 0], [0, 1, 1]) and np.allclose(out[:, 1], [0, 0.5, 1])


def test_adult_files_are_parsed_with_their_quirks(tmp_path):
    counts = write_adult(tmp_path, n_train=150, n_test=60)
    data = build_adult(root=tmp_path)
    ytr = data.train.tensors[1]
    xte, yte, gte = data.test.tensors
    # the banner line of adult.test is skipped, the trailing dots stripped, blank lines dropped
    assert len(ytr) == 150 and int(ytr.sum()) == counts["train_rich"]
    assert len(yte) == 60 and int(yte.sum()) == counts["test_rich"]
    assert int(gte.sum()) == counts["test_female"]
    width = len(ADULT_NUMERIC) + sum(len(v) for v in ADULT_CATEGORIES.values())
    assert data.input_shape == (width,)
    assert data.task == "fair_classification" and data.extras["protected_attribute"] == "sex"
    # "?" is the all-zero block of its attribute, never a category
    wc = len(ADULT_NUMERIC)
    rows = (tmp_path / "adult" / "adult.data").read_text().splitlines()
    missing = [i for i, r in enumerate(rows) if r.split(", ")[1:2] == ["?"]]
    assert missing and float(data.train.tensors[0][missing, wc:wc + 8].sum()) == 0.0
    no_sex = build_adult(root=tmp_path, include_protected=False)
    assert no_sex.input_shape == (width - 2,)


def test_dutch_arff_is_parsed_with_groups_and_labels(tmp_path):
    counts = write_dutch(tmp_path, n=200)
    data = build_dutch(root=tmp_path)
    assert len(data.train) + len(data.test) == 200 and len(data.train) == 160
    x = data.train.tensors[0]
    assert (x.sum(1) == 11).all()  # one known category per attribute (occupation is the label)
    yte, gte = data.test.tensors[1:]
    assert int(data.train.tensors[1].sum() + yte.sum()) == counts["positive"]
    other = build_dutch(root=tmp_path, positive_occupation="5_4_9")
    assert int(other.train.tensors[1].sum() + other.test.tensors[1].sum()) == 200 - counts[
        "positive"]
    with pytest.raises(ConfigError, match="positive_occupation"):
        build_dutch(root=tmp_path, positive_occupation="9")


def test_celeba_attributes_follow_the_official_partition(tmp_path):
    written = write_celeba(tmp_path, n=60)
    values, partition = written["values"], written["partition"]
    data = build_celeba_attributes(root=tmp_path, target="Smiling", protected="Male")
    train, test = np.flatnonzero(partition == 0), np.flatnonzero(partition == 2)
    assert len(data.train) == len(train) and len(data.test) == len(test)
    assert data.train.tensors[1].tolist() == (values["Smiling"].to_numpy()[train] > 0).tolist()
    assert data.test.tensors[2].tolist() == (values["Male"].to_numpy()[test] > 0).tolist()
    assert data.input_shape == (39,)  # 40 attributes less the target
    assert build_celeba_attributes(root=tmp_path, include_protected=False).input_shape == (38,)
    with pytest.raises(ConfigError, match="dataset.target"):
        build_celeba_attributes(root=tmp_path, target="Purple_Hair")
