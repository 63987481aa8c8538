"""docs/privacy-unit-and-streams.md's tables (``dpbench.analysis.user_level_table``)."""

from __future__ import annotations

import pytest

from dpbench.analysis.user_level_table import calibration_table, epsilon_table


def _cells(table: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def test_epsilon_table_uls_is_the_example_level_and_group_is_above_els():
    rows = _cells(epsilon_table(settings=((0.05, 3.0, 20),), ks=(1, 2)))
    assert [r[3] for r in rows] == ["1", "2"]
    for _, _, _, k, example, uls, els, group in rows:
        assert uls == example
        assert float(els) <= float(group)
        if k == "1":
            assert els == example == group
        else:
            assert float(els) > float(example)


@pytest.mark.slow
def test_calibration_table_els_needs_more_noise_than_uls():
    rows = _cells(calibration_table(settings=((0.05, 20),), targets=(4.0,), ks=(2,)))
    (_, _, _, uls, els), = rows
    assert float(els) > float(uls)
