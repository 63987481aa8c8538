"""The digits data set: the bundled file is parsed once per process, yet every build hands
out tensors of its own (a run that casts or writes into its data touches no other run's)."""

from __future__ import annotations

import warnings

import torch
from sklearn.datasets import load_digits

from dpbench.data.base import fixed_split
from dpbench.data.digits import _bundled_digits, build_digits


def test_each_build_has_its_own_tensors_equal_to_a_fresh_parse():
    first, second = build_digits(), build_digits()
    pairs = list(zip(first.train.tensors + first.test.tensors,
                     second.train.tensors + second.test.tensors))
    for a, b in pairs:
        assert a.data_ptr() != b.data_ptr() and torch.equal(a, b)
    # the reference: the file parsed again, built as before the parse was kept
    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.long)
    tr, te = fixed_split(len(y), 0.8)
    for got, want in zip(first.train.tensors + first.test.tensors, (x[tr], y[tr], x[te], y[te])):
        assert got.dtype == want.dtype and torch.equal(got, want)
    # what one run does to its data reaches no other build
    first.train.tensors[0].mul_(0).add_(7.0)
    first.test.tensors[1].fill_(3)
    third = build_digits()
    assert torch.equal(third.train.tensors[0], x[tr]) and torch.equal(third.test.tensors[1], y[te])
    assert torch.equal(second.train.tensors[0], x[tr])
    # another setting gets its own split of the same parse
    other = build_digits(train_fraction=0.5)
    assert len(other.train) == round(0.5 * len(y))


def test_the_kept_parse_is_read_only_and_parsed_once():
    _bundled_digits.cache_clear()
    build_digits(), build_digits(0.5)
    assert _bundled_digits.cache_info().misses == 1
    images, target = _bundled_digits()
    assert not images.flags.writeable and not target.flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch.tensor copies: no warning about read-only arrays
        build_digits()
