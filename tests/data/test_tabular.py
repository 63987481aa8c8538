"""Tabular loaders: fixed schema encodings, published label counts, protected groups."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpbench.data.tabular import (
    ADULT_CATEGORIES,
    ADULT_NUMERIC,
    build_adult,
    build_dutch,
    one_hot,
    scale_fixed,
)
from dpbench.errors import ConfigError


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


def test_adult_counts_and_groups(shared_data):
    data = build_adult(root=shared_data)
    ytr = data.train.tensors[1]
    xte, yte, gte = data.test.tensors
    assert len(ytr) == 32561 and int(ytr.sum()) == 7841  # adult.data: 7841 >50K
    assert len(yte) == 16281 and int(yte.sum()) == 3846  # adult.test: 3846 >50K.
    width = len(ADULT_NUMERIC) + sum(len(v) for v in ADULT_CATEGORIES.values())
    assert data.input_shape == (width,)
    assert data.task == "fair_classification" and set(gte.unique().tolist()) == {0, 1}
    no_sex = build_adult(root=shared_data, include_protected=False)
    assert no_sex.input_shape == (width - 2,)


def test_dutch_counts_and_groups(shared_data):
    data = build_dutch(root=shared_data)
    n_train, n_test = len(data.train), len(data.test)
    assert n_train + n_test == 60420
    x = data.train.tensors[0]
    assert (x.sum(1) == 11).all()  # every row has one known category per attribute
    yte, gte = data.test.tensors[1:]
    assert gte.float().mean().item() == pytest.approx(30273 / 60420, abs=0.02)  # female share
    y_all = int(data.train.tensors[1].sum() + yte.sum())
    assert y_all == 28763  # occupation 2_1 rows in the ARFF
    with pytest.raises(ConfigError, match="positive_occupation"):
        build_dutch(root=shared_data, positive_occupation="9")
