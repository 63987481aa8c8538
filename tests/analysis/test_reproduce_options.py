"""dpbench-reproduce refuses malformed seeds in one line (exit 2) before any run starts."""

import pytest

from dpbench.analysis.reproduce import parse_args


@pytest.mark.parametrize("seeds", ["abc", "0,0", "1,-2", "", "0,,1"])
def test_malformed_seeds_are_refused_before_any_run(seeds, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["fiber", "--seeds", seeds])
    assert exit_info.value.code == 2 and "--seeds" in capsys.readouterr().err


def test_well_formed_seeds_are_kept():
    assert parse_args(["fiber", "--seeds", "0, 1,2"]).seeds == "0,1,2"
