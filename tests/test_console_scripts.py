"""Every console script of ``[project.scripts]`` works the way a user runs it.

Each script is started as a fresh process, from a folder outside the repository, through the
launcher that ``pip install`` wrote next to the interpreter: first with ``--help``, then with
one minimal real invocation, asserting exit 0 and the files it should write. In-process calls
of a ``main`` cannot catch what only a fresh interpreter shows (a schema registered only as a
side effect of another module's import made ``dpbench-audit`` fail for every user while
in-process tests passed).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip-tools (a dev extra) brings tomli
    import tomli as tomllib

import pytest

# fresh processes through the installed launchers: make test-processes (docs/testing.md)
pytestmark = [pytest.mark.integration, pytest.mark.processes]

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SCRIPTS = sorted(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])
QUIET = ["logger=none", "trainer.progress=false", "trainer.epochs=1"]


@functools.cache
def _environment(cwd: Path) -> dict[str, str]:
    """Return the user's environment; PYTHONPATH only if the installed dpbench is elsewhere.

    On a clone installed with ``make setup`` the launchers import this checkout as they are;
    from a second work tree of the same clone they would import the first, so the checkout
    under test is put first on the path.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", WANDB_MODE="offline")
    env.pop("DPBENCH_DATA_ROOT", None)
    found = subprocess.run([sys.executable, "-c", "import dpbench; print(dpbench.__file__)"],
                           cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    if found.returncode != 0 or not Path(found.stdout.strip()).is_relative_to(REPO):
        env["PYTHONPATH"] = str(REPO)
    return env


def _run(script: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    launcher = BIN / script
    assert launcher.is_file(), f"{launcher} is missing: is dpbench installed (make setup)?"
    done = subprocess.run([str(launcher), *args], cwd=cwd, env=dict(_environment(cwd)),
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{script} {' '.join(args)} exited {done.returncode}:\n" \
                                 f"{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="session")  # session, as ``trained`` that needs it
def outside(tmp_path_factory) -> Path:
    """A working folder outside the repository."""
    folder = tmp_path_factory.mktemp("user")
    assert not folder.resolve().is_relative_to(REPO)
    return folder


#: the tests reading ``trained``: --dist loadgroup keeps them on one worker, which makes it once
SHARES_THE_RUN = pytest.mark.xdist_group("console_scripts_trained")


@pytest.fixture(scope="session")  # not module: another module's test between its two users
def trained(outside) -> Path:  # (random order, xdist) would tear it down and run it again
    """A 1-epoch digits run made by ``dpbench``: its sweep folder."""
    _run("dpbench", [*QUIET, f"hydra.run.dir={outside / 'sweep' / 'run'}"], outside)
    return outside / "sweep"


#: the scripts whose --help is Hydra's page (the others use argparse)
HYDRA_SCRIPTS = ("dpbench", "dpbench-audit", "dpbench-mia")


def test_every_script_is_covered_here():
    assert SCRIPTS == ["dpbench", "dpbench-audit", "dpbench-bench", "dpbench-mia",
                       "dpbench-report", "dpbench-reproduce", "dpbench-tune"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_starts_from_a_fresh_shell(script, outside):
    done = _run(script, ["--help"], outside)
    assert script.removeprefix("dpbench-").split("-")[0] in (done.stdout + done.stderr).lower()
    assert "error" not in done.stderr.lower()
    # each program's page names itself first (not dpbench's page under another name)
    assert done.stdout.lstrip().startswith(f"{script}:") or script not in HYDRA_SCRIPTS


@SHARES_THE_RUN
def test_dpbench_trains_one_epoch(trained):
    record = json.loads((trained / "run" / "results.json").read_text())
    assert record["status"] == "completed" and record["method"] == "dpsgd"
    assert 0 < record["epsilon"] <= 3.0


def test_dpbench_audit_runs_one_epoch(outside):
    run = outside / "audit"
    done = _run("dpbench-audit", ["method=dpsgd", "privacy=eps1", *QUIET,
                                  "audit.canaries=100", f"hydra.run.dir={run}"], outside)
    record = json.loads((run / "results.json").read_text())
    assert record["kind"] == "audit" and record["status"] == "completed"
    assert record["epsilon_lower"] <= record["audit"]["power"]
    assert "| dpsgd | digits |" in done.stdout


def test_dpbench_mia_attacks_one_small_cell(outside):
    run = outside / "mia"
    done = _run("dpbench-mia", ["method=dpsgd", "privacy=eps1", *QUIET, "mia.pool_size=60",
                                "mia.population_size=30", "mia.references=2",
                                "mia.bootstrap=20", "trainer.batch_size=16",
                                f"hydra.run.dir={run}"], outside)
    record = json.loads((run / "results.json").read_text())
    assert record["kind"] == "mia" and record["status"] == "completed"
    assert (run / "roc.csv").is_file() and (run / "roc.png").is_file()
    assert "| dpsgd | digits |" in done.stdout


@SHARES_THE_RUN
def test_dpbench_report_tabulates_the_run(trained):
    done = _run("dpbench-report", [str(trained)], trained.parent)
    assert "| dpsgd" in done.stdout and "eps=3" in done.stdout
    for name in ("report.md", "report.csv", "runs.csv", "privacy_utility.png"):
        assert (trained / name).is_file(), name


def test_dpbench_reproduce_dry_run_prints_and_writes_nothing(outside):
    before = sorted(p.name for p in outside.iterdir())
    done = _run("dpbench-reproduce", ["fiber", "--dry-run", "--out", str(outside / "repro")],
                outside)
    assert "dpbench-tune" in done.stdout
    assert sorted(p.name for p in outside.iterdir()) == before


def test_dpbench_reproduce_until_decided_pilots_every_cell_claims_with_ten_seeds(outside):
    """FIBER's claims span four epsilons, so its design's pilot is 10 seeds a cell unless
    ``--pilot`` says otherwise: a budget of one run refuses either pilot before anything
    runs, naming its size (twice the runs of a 5-seed pilot), and writes nothing; a smaller
    ``--pilot`` is noted."""
    sizes = {}
    for pilot in ([], ["--pilot", "5"]):
        out = outside / f"pilot{len(pilot)}"
        done = subprocess.run(
            [str(BIN / "dpbench-reproduce"), "fiber", "--until-decided", "--budget", "1",
             *pilot, "--out", str(out)], cwd=outside, env=dict(_environment(outside)),
            capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        assert done.returncode == 2, done.stderr[-2000:]
        line = done.stderr.strip().splitlines()[-1]
        assert "the pilot alone is" in line and "over --budget 1" in line, line
        sizes[len(pilot)] = int(line.split("the pilot alone is ")[1].split()[0])
        assert not (out / "reproduce" / "cpu" / "fiber" / "design.json").exists()
        assert ("under the design's 10 for claims of several cells" in done.stdout) == bool(
            pilot)
    assert sizes[0] == 2 * sizes[2] > 0


@pytest.mark.slow  # 3 seeds x 10 digits sweeps and a follow-up: minutes on 2 cores
def test_dpbench_reproduce_until_decided_runs_the_design(outside):
    """The two-stage design as a user runs it: the design declared before the pilot, the
    follow-up recorded and within the budget, claims.md showing the stages."""
    out = outside / "design"
    done = _run("dpbench-reproduce", ["samplers", "--until-decided", "--pilot", "3",
                                      "--budget", "40", "--jobs", "2", "--out", str(out)],
                outside)
    assert "stage 1, the pilot: 3 seeds a cell, 30 runs" in done.stdout
    design = json.loads((out / "reproduce" / "cpu" / "samplers" / "design.json").read_text())
    assert design["pilot"] == [0, 1, 2]
    follow = design["follow_up"]
    assert 2 * len(follow) <= 40 - 30   # the claim's two sweeps, within the budget
    claims = (out / "claims" / "claims.md").read_text()
    row = next(line for line in claims.splitlines() if line.startswith("| samplers |"))
    assert f"3 + {len(follow)}" in row if follow else "3 + 0" in row


def test_dpbench_bench_times_one_repetition(outside):
    done = _run("dpbench-bench", ["--models", "mlp", "--modes", "bk", "--opacus-modes",
                                  "--reps", "1", "--warmup", "0", "--rounds", "1",
                                  "--threads", "1"], outside)
    assert "| mlp | dpbench bk |" in done.stdout
    users = _run("dpbench-bench", ["--models", "mlp", "--modes", "bk", "ghost", "--users", "4",
                                   "--reps", "1", "--warmup", "0", "--rounds", "1",
                                   "--threads", "1"], outside)
    assert "| mlp | bk per user | 256 (64 users of 4) |" in users.stdout
    assert "| mlp | ghost per user |" in users.stdout


def test_dpbench_tune_with_one_learning_rate(outside):
    out = outside / "tune"
    _run("dpbench-tune", ["--lrs", "0.1", "--seeds", "0", "--jobs", "1", "--out", str(out),
                          "--", *QUIET], outside)
    choices = json.loads((out / "choices.json").read_text())
    assert choices, "choices.json is empty"
    assert (out / "report.md").is_file()
    records = list((out / "runs").glob("*/results.json"))
    assert len(records) == 1
    assert json.loads(records[0].read_text())["status"] == "completed"
