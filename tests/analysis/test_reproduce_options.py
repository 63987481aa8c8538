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


def test_reproduce_counts_every_sweeps_runs_for_its_progress(tmp_path):
    from dpbench.runners.reproduce import job_runs, load_spec, parse_args, sweep_commands

    args = parse_args(["fiber", "bounded_adaclip", "--out", str(tmp_path)])
    runs = {paper: [job_runs(j) for j in sweep_commands(load_spec(paper), args, tmp_path)]
            for paper in args.papers}
    # FIBER: 4 methods x 4 epsilons x 5 seeds, three ablations x 5, BandMF 4 x 5; bounded
    # adaptive clipping: 3 methods x 10 seeds, or DP-SGD alone, on each data set
    assert runs == {"fiber": [80, 5, 5, 5, 20], "bounded_adaclip": [30, 10, 30, 10]}


def test_a_bad_claim_stops_reproduce_before_any_run(tmp_path, monkeypatch, capsys):
    import yaml

    from dpbench.runners import reproduce

    spec = yaml.safe_load((reproduce.SPEC_DIR / "fiber.yaml").read_text())
    spec["claims"][0]["paper_effect"] = -0.02
    (tmp_path / "fiber.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.setattr(reproduce, "SPEC_DIR", tmp_path)
    assert reproduce.main(["fiber", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("dpbench-reproduce: error: claim 'fiber_vs_disk': key 'paper_effect': "
                   "must be a positive number (got -0.02)")
    assert not (tmp_path / "out").exists()


def test_appending_seeds_keeps_every_finished_runs_job_number(tmp_path):
    """A follow-up (or --claim-seeds) appends seeds to a sweep of several methods: Hydra's
    own sweeper numbers the jobs of the longer command, and every pilot run keeps its job
    number (its folder is ``<job.num>_<run_name>``, so it is resumed, not run again)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from dpbench.runners.reproduce import load_spec, parse_args, sweep_commands

    def numbering(seeds: str) -> dict[tuple[str, ...], int]:
        args = parse_args(["bounded_adaclip", "--seeds", seeds, "--out", str(tmp_path)])
        cmd = sweep_commands(load_spec("bounded_adaclip"), args, tmp_path)[0]["cmd"]
        overrides = OverridesParser.create().parse_overrides(
            [o for o in cmd[cmd.index("-m", 3) + 1:] if not o.startswith("hydra.")])
        [batch] = BasicSweeper.split_arguments(overrides, None)
        return {tuple(o for o in job if o.startswith(("seed=", "method="))): num
                for num, job in enumerate(batch)}

    pilot, longer = numbering("0,1,2,3,4"), numbering("0,1,2,3,4,5,6,7,8")
    assert len(pilot) == 15 and len(longer) == 27
    assert all(longer[key] == num for key, num in pilot.items())
