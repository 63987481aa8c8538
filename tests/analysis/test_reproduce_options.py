"""dpbench-reproduce refuses malformed seeds in one line (exit 2) before any run starts."""

import sys

import pytest

from dpbench.runners.reproduce import main, parse_args


@pytest.mark.parametrize("seeds", ["abc", "0,0", "1,-2", "", "0,,1"])
def test_malformed_seeds_are_refused_before_any_run(seeds, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["fiber", "--seeds", seeds])
    assert exit_info.value.code == 2 and "--seeds" in capsys.readouterr().err


def test_well_formed_seeds_are_kept():
    assert parse_args(["fiber", "--seeds", "0, 1,2"]).seeds == "0,1,2"


@pytest.mark.parametrize("paper", ["bounded_adaclip", "fiber"])  # a plain and a tuned paper
def test_a_dry_run_prints_the_commands_and_writes_nothing(paper, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([paper, "--dry-run", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed and all(line.split()[0].startswith(("dpbench", sys.executable))
                           for line in printed), printed[:3]
    assert not out.exists()  # no folder, log, table, plot or claim
