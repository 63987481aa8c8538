"""The one place range checks and their messages live (``dpbench.utils.ranges``): every
refusal names its key, says what is accepted and shows what was given, on one line."""

from __future__ import annotations

import math

import pytest

from dpbench.errors import ConfigError
from dpbench.utils import ranges


@pytest.mark.parametrize("check,message", [
    (lambda: ranges.positive("privacy.clip_norm", 0), "privacy.clip_norm must be a number > 0 "
                                                      "(got 0)"),
    (lambda: ranges.positive("k", math.nan), "k must be a number > 0 (got nan)"),
    (lambda: ranges.positive("k", None), "k must be a number > 0 (got None)"),
    (lambda: ranges.positive_finite("method.optimizer.lr", math.inf),
     "method.optimizer.lr must be a finite number > 0 (got inf)"),
    (lambda: ranges.int_at_least("trainer.epochs", True, 1),
     "trainer.epochs must be an integer >= 1 (got True)"),
    (lambda: ranges.int_at_least("dataset.train_subset", -5, 1, allow_none=True),
     "dataset.train_subset must be an integer >= 1 or null (got -5)"),
    (lambda: ranges.in_range("trainer.num_threads", 0, 1, 1024, integer=True, allow_none=True),
     "trainer.num_threads must be an integer in [1, 1024] or null (got 0)"),
    (lambda: ranges.in_range("f", 1, 0, 1, closed="()"), "f must be a number in (0, 1) (got 1)"),
    (lambda: ranges.in_range("f", 0, 0, 1, closed="(]"), "f must be a number in (0, 1] (got 0)"),
    (lambda: ranges.in_range("f", 1, 0, 1, closed="[)"), "f must be a number in [0, 1) (got 1)"),
    (lambda: ranges.in_range("f", "x", 0, 1), "f must be a number in [0, 1] (got 'x')"),
    (lambda: ranges.require(False, "privacy.delta", "< 1/N = 0.01", shown="0.05",
                            why="; lower it"), "privacy.delta must be < 1/N = 0.01 (got 0.05); "
                                               "lower it"),
    (lambda: ranges.require(False, "privacy.target_epsilon", "finite", why="; use x"),
     "privacy.target_epsilon must be finite; use x"),
])
def test_a_refusal_names_its_key_and_value(check, message):
    with pytest.raises(ConfigError) as err:
        check()
    assert str(err.value) == message


def test_values_in_range_pass():
    ranges.positive("k", 1e-9)
    ranges.positive("k", None, allow_none=True)
    ranges.positive_finite("k", 3)
    ranges.int_at_least("k", 0, 0)
    ranges.int_at_least("k", None, 1, allow_none=True)
    ranges.in_range("k", 1, 0, 1)
    ranges.in_range("k", 0, 0, 1, closed="[)")
    ranges.in_range("k", None, 0, 1, allow_none=True)
    ranges.in_range("seed", 2**63 - 1, 0, 2**63, closed="[)", integer=True)
    ranges.require(True, "k", "anything", 1)
