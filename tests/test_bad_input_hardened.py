"""Readers that check every number, folder kinds, upper bounds on counts, and commands that
stop cleanly on a signal (docs/reliability-bad-input.md, "Files a command reads", "Counts",
"Signals")."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dpbench.errors import ConfigError
from dpbench.runners import reproduce
from dpbench.runners.reproduce import BadWallTime, SpecError, read_wall_time

REPO = Path(__file__).resolve().parents[1]
QUIET = ["logger=none", "trainer.progress=false", "trainer.device=cpu"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
            "WANDB_MODE": "disabled"}


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


# --- a reproduction spec with a typo ---------------------------------------------------------

@pytest.mark.parametrize(("edit", "message"), [
    (lambda s: s["sweeps"][0].__setitem__("overides", s["sweeps"][0].pop("overrides")),
     "unknown key 'overides' (did you mean 'overrides'?)"),
    (lambda s: s["sweeps"][0].pop("overrides"), "the key 'overrides' is missing"),
    (lambda s: s["sweeps"][0].__setitem__("overrides", "method=dpsgd"),
     "overrides must be a list of strings"),
    (lambda s: s.__setitem__("sweep", s.pop("sweeps")), "unknown key 'sweep' (did you mean"),
    (lambda s: s.__setitem__("scales", [1]), "scales must be a mapping"),
], ids=["typo", "missing", "not-a-list", "top-typo", "scales"])
def test_a_spec_typo_is_one_line_naming_the_key(tmp_path, monkeypatch, capsys, edit, message):
    """Before, ``overides:`` crashed with ``KeyError: 'overrides'``."""
    for other in reproduce.SPEC_DIR.glob("*.yaml"):
        (tmp_path / other.name).write_text(other.read_text())
    spec = yaml.safe_load((reproduce.SPEC_DIR / "samplers.yaml").read_text())
    edit(spec)
    (tmp_path / "samplers.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.setattr(reproduce, "SPEC_DIR", tmp_path)
    with pytest.raises(SpecError, match=re.escape(message)) as err:
        reproduce.load_spec("samplers")
    assert str(err.value).startswith("conf/reproduce/samplers.yaml")
    assert reproduce.main(["samplers", "--dry-run"]) == 2
    err_lines = _lines(capsys.readouterr().err)
    assert len(err_lines) == 1 and message in err_lines[0], err_lines


def test_every_spec_of_the_package_passes_the_check():
    for paper in reproduce.PAPERS:
        reproduce.check_spec(paper, yaml.safe_load((reproduce.SPEC_DIR / f"{paper}.yaml")
                                                   .read_text()))


# --- wall_time.json --------------------------------------------------------------------------

WALL_TIMES = [
    ("{not json", "is not JSON"),
    ('{"seconds": "abc", "jobs": 2}', "seconds='abc' is not a finite number >= 0"),
    ('{"seconds": -5, "jobs": 2}', "seconds=-5 is not a finite number >= 0"),
    ('{"seconds": NaN, "jobs": 2}', "seconds=nan is not a finite number >= 0"),
    ('{"seconds": 1e999, "jobs": 2}', "seconds=inf is not a finite number >= 0"),
    ('{"seconds": 60, "jobs": 0}', "jobs=0 is not an integer in [1, 256]"),
    ('{"seconds": 60, "jobs": "x"}', "jobs='x' is not an integer"),
    ('{"seconds": 60, "jobs": 2, "finished": 5}', "finished=5 is not a time"),
    ("[1, 2]", "is not a JSON object"),
    ("1" * 5000, "more than the 4096 allowed"),
]


@pytest.mark.parametrize(("text", "message"), WALL_TIMES)
def test_a_corrupt_wall_time_is_refused_in_one_line(tmp_path, text, message):
    path = tmp_path / "wall_time.json"
    path.write_text(text)
    with pytest.raises(BadWallTime) as err:
        read_wall_time(path)
    assert str(err.value).startswith(str(path)) and message in str(err.value), err.value


def test_a_good_wall_time_is_read_as_written(tmp_path):
    path = tmp_path / "wall_time.json"
    path.write_text('{"seconds": 90.5, "jobs": 2, "finished": "2026-12-03 10:00:00 UTC"}')
    assert read_wall_time(path) == {"seconds": 90.5, "jobs": 2,
                                    "finished": "2026-12-03 10:00:00 UTC"}


def _claims_only(out: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpbench.runners.reproduce", "samplers",
                           "--claims-only", "--out", str(out)], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.processes
@pytest.mark.parametrize("plant", ["fifo", "mistyped"])
def test_reproduce_refuses_a_fifo_or_mistyped_wall_time_in_one_line(tmp_path, plant):
    """Before, a FIFO hung ``--claims-only`` and a mistyped file crashed it."""
    paper = tmp_path / "out" / "reproduce" / "cpu" / "fiber"
    paper.mkdir(parents=True)
    wall = paper / "wall_time.json"
    if plant == "fifo":
        os.mkfifo(wall)
    else:
        wall.write_text('{"seconds": "abc"}')
    done = _claims_only(tmp_path / "out", tmp_path)
    lines = _lines(done.stderr)
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(f"dpbench-reproduce: error: {wall}")
    assert not (tmp_path / "out" / "claims").exists()


# --- counts have upper bounds ----------------------------------------------------------------

@pytest.mark.parametrize(("argv", "message"), [
    (["fiber", "--claim-seeds", "fiber_vs_disk=200000000"], "2 <= N <= 1000"),
    (["fiber", "--seeds", ",".join(map(str, range(1001)))], "1001 seeds, more than the 1000"),
    (["fiber", "--jobs", "100000"], "--jobs must be between 1 and 256"),
])
def test_reproduce_counts_have_upper_bounds(capsys, argv, message):
    """Before, ``--claim-seeds NAME=200000000`` ended in MemoryError."""
    with pytest.raises(SystemExit) as exc:
        reproduce.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("key", "value", "message"), [
    ("references", 1_000_000_000, "mia.references must be an integer in [1, 1000]"),
    ("bootstrap", 1_000_000_000, "mia.bootstrap must be an integer in [1, 100000]"),
    ("targets", 5000, "mia.targets must be an integer in [1, 1000]"),
    ("pool_size", 10**9, "mia.pool_size must be an integer in [8, 10000000]"),
    ("population_size", 10**9, "mia.population_size must be an integer in [1, 10000000]"),
])
def test_mia_counts_have_upper_bounds(key, value, message):
    """Before, ``mia.references=1000000000`` ran until killed."""
    from dpbench.audit.mia.settings import MIASettings

    with pytest.raises(ConfigError) as err:
        MIASettings(**{key: value})
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("key", ["canaries", "guesses_included", "guesses_excluded"])
def test_audit_counts_have_upper_bounds(key):
    from dpbench.audit.canaries import AuditSettings

    with pytest.raises(ConfigError, match=rf"audit.{key} must be an integer in \[\d, 1000000\]"):
        AuditSettings(**{key: 10**9})


@pytest.mark.parametrize(("options", "message"), [
    ({"seeds": list(range(1001))}, "--seeds: 1001 seeds, more than the 1000 allowed"),
    ({"jobs": 10**6}, "--jobs must be an integer in [1, 256]"),
    ({"lrs": [0.1] * 10**5}, "--lrs: 100000 learning rates, more than the"),
])
def test_tune_counts_have_upper_bounds(options, message):
    from dpbench.tune.cli import make_job

    with pytest.raises(ConfigError) as err:
        make_job(["method=dpsgd"], **options)
    assert str(err.value).startswith(message)


def test_a_fresh_mia_command_refuses_a_billion_references_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "dpbench.audit.mia", *QUIET,
                           "mia.references=1000000000", f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    lines = _lines(done.stderr)
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert "mia.references must be an integer in [1, 1000]" in lines[0]
    assert not (tmp_path / "run").exists()


# --- a run folder holds one kind of record ---------------------------------------------------

@pytest.mark.parametrize("kind", ["mia", "audit", "something-else"])
def test_a_training_run_never_replaces_another_kind_of_record(tmp_path, kind):
    """Before, a training run overwrote a membership-inference record in the same folder."""
    run = tmp_path / "run"
    run.mkdir()
    record = {"kind": kind, "status": "completed", "mia_auc": 0.6}
    (run / "results.json").write_text(json.dumps(record))
    done = subprocess.run([sys.executable, "-m", "dpbench", *QUIET, "trainer.epochs=1",
                           f"hydra.run.dir={run}"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=300)
    lines = _lines(done.stderr)
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert f"hydra.run.dir={run} holds a" in lines[0] and "choose another folder" in lines[0]
    assert json.loads((run / "results.json").read_text()) == record
    assert sorted(p.name for p in run.iterdir()) == ["results.json"]


# --- signals ---------------------------------------------------------------------------------

def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                         text=True).stdout
    return [int(p) for p in out.split()]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_reproduce_stops_with_its_sweeps_on_a_signal(tmp_path, sig):
    """Before, SIGTERM left the sweep it started running as an orphan that kept writing runs;
    now the sweeps' process group is stopped, one line says so, and the exit code is 3."""
    proc = subprocess.Popen([sys.executable, "-m", "dpbench.runners.reproduce", "samplers",
                             "--jobs", "1", "--seeds", "0", "--out", str(tmp_path / "out")],
                            cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    children: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while not children and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            children = _children(proc.pid)
        assert children, "dpbench-reproduce started no sweep"
        time.sleep(4)  # the sweep is training
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=180)
        lines = _lines(err)
        assert proc.returncode == 3, err[-3000:]
        assert lines and lines[-1].startswith(
            f"dpbench-reproduce: preempted by {sig.name}; the sweeps it started were stopped")
        assert "Traceback" not in err
        time.sleep(1)
        assert not any(_group_alive(c) for c in children), "a sweep outlived dpbench-reproduce"
    finally:
        proc.kill()
        for child in children:
            try:
                os.killpg(child, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_mia_stops_on_a_signal_in_one_line(tmp_path, sig):
    """Before, Ctrl-C gave a traceback and SIGTERM no preemption message."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "dpbench.audit.mia", *QUIET,
                             "method=dpsgd", "privacy=eps1", "trainer.epochs=50",
                             "mia.pool_size=400", "mia.references=8", "trainer.batch_size=16",
                             f"hydra.run.dir={run}"],
                            cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not run.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        time.sleep(6)  # training its models
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    lines = _lines(err)
    assert proc.returncode == 3, err[-3000:]
    assert "Traceback" not in err
    assert lines[-1].startswith(f"dpbench-mia: preempted by {sig.name} before its record was "
                                "written"), lines
    assert not (run / "results.json").exists()


# --- a record whose epsilon cannot be derived ------------------------------------------------

def test_records_without_a_derivable_epsilon_are_never_under_an_epsilon_column(tmp_path):
    """Before, a hand-written record with no ledger and one marked ``private: false`` with
    ``target_epsilon: 1`` showed as ``eps=1 0.9850 (n=2)`` with no mark."""
    from dpbench.analysis.plots import utility_curves
    from dpbench.analysis.report import build_report
    from dpbench.analysis.results import UNDERIVED_LABEL, load_frame

    base = {"status": "completed", "method": "dpsgd", "method_name": "dpsgd",
            "dataset": "digits", "model": "logreg", "target_epsilon": 1, "epsilon": 1.0,
            "metrics": {"accuracy": 0.985}, "tuning": {"mode": "none"}}
    for i, extra in enumerate([{}, {"private": False}]):
        (tmp_path / f"r{i}").mkdir()
        (tmp_path / f"r{i}" / "results.json").write_text(json.dumps({**base, **extra,
                                                                     "seed": i}))
    frame, markdown = build_report(tmp_path)
    table = markdown.split("\n\n")[0]
    assert "eps=1" not in markdown and "eps=" not in table.splitlines()[0]
    assert f"| {UNDERIVED_LABEL}" in table.splitlines()[0] or UNDERIVED_LABEL in table
    assert "Runs whose epsilon cannot be derived" in markdown
    assert (tmp_path / "r0").as_posix() in markdown and (tmp_path / "r1").as_posix() in markdown
    assert frame["target_epsilon"].isna().all() and frame["epsilon"].isna().all()
    assert utility_curves(load_frame(tmp_path), "accuracy") == {}


def test_a_record_whose_target_was_lowered_is_refused(tmp_path):
    """A run that spent 2.99 with its target edited to 1 once read as ``eps=1``."""
    from dpbench.analysis.results import iter_records
    from tests.helpers.report_records import with_ledger

    true = with_ledger({"status": "completed", "method": "dpsgd", "dataset": "digits",
                        "model": "mlp", "seed": 0, "target_epsilon": 100.0,
                        "metrics": {"accuracy": 0.9}})
    lowered = {**true, "target_epsilon": true["epsilon"] / 3}
    for name, record in (("true", true), ("lowered", lowered)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(record))
    read = dict(iter_records(tmp_path))
    assert read[tmp_path / "true" / "results.json"]["epsilon"] == true["epsilon"]
    message = read[tmp_path / "lowered" / "results.json"]
    assert isinstance(message, str) and "above its target" in message


@pytest.mark.parametrize(("field", "value", "message"), [
    ("target_epsilon", float("nan"), "target_epsilon nan is not a finite number > 0"),
    ("target_epsilon", -1, "target_epsilon -1 is not a finite number > 0"),
    ("epsilon", float("nan"), "epsilon nan is not a number >= 0"),
    ("epsilon", -0.5, "epsilon -0.5 is not a number >= 0"),
])
def test_a_nan_or_negative_epsilon_is_refused_naming_the_key(tmp_path, field, value, message):
    """Found by the property test: a NaN target read as a record with no target."""
    from dpbench.analysis.results import iter_records
    from tests.helpers.report_records import with_ledger

    record = with_ledger({"status": "completed", "method": "dpsgd", "dataset": "digits",
                          "model": "mlp", "seed": 0, "target_epsilon": 3.0,
                          "metrics": {"accuracy": 0.9}})
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.json").write_text(json.dumps({**record, field: value}))
    [(_, read)] = list(iter_records(tmp_path))
    assert isinstance(read, str) and message in read
