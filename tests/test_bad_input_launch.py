"""What Hydra runs before the job, and files planted in a run folder: refused in one line
(exit 2), before anything runs or is written (docs/reliability-bad-input.md, "What Hydra runs
and what a run folder holds")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpbench.cli import hydra_main, main
from dpbench.config.hydra_guard import check_hydra_command, check_logging_config
from dpbench.errors import ConfigError
from dpbench.utils.conf import CONF_DIR
from dpbench.utils.threads import available_cores
from tests.helpers.cli import QUIET_CLI, run_cli
from tests.helpers.config import compose_config

pytestmark = pytest.mark.integration  # whole runs or processes: make test, not test-quick

REPO = Path(__file__).resolve().parents[1]
BASE = ["dataset=digits", "model=logreg", "method=dpsgd", "privacy=eps3", "trainer.epochs=1",
        "trainer.batch_size=64"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _main(monkeypatch, capfd, args: list[str]) -> tuple[int, list[str]]:
    """Run the ``dpbench`` console script's ``main`` in-process; return (exit code, stderr
    lines). The guard runs before Hydra, so a refusal never reaches ``hydra.main``."""
    monkeypatch.setattr(sys, "argv", ["dpbench", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    err = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    return code, err


# --- what Hydra instantiates: callbacks and logging factories --------------------------------

@pytest.mark.processes  # a fresh interpreter: make test-processes
def test_a_hydra_callback_outside_the_allow_list_never_runs_in_a_fresh_process(tmp_path):
    marker = tmp_path / "payload-ran"
    proc = subprocess.run(
        [sys.executable, "-m", "dpbench", *BASE, *QUIET_CLI,
         "+hydra.callbacks.x._target_=pathlib.Path.touch", f"+hydra.callbacks.x.self={marker}"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert not marker.exists()
    assert len(lines) == 1 and lines[0].startswith("dpbench: error: hydra.callbacks.x._target_="
                                                   "'pathlib.Path.touch'"), lines
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_dpbench_audit_refuses_a_hydra_callback_in_a_fresh_process(tmp_path):
    marker = tmp_path / "payload-ran"
    proc = subprocess.run(
        [sys.executable, "-m", "dpbench.audit", *QUIET_CLI, "audit.canaries=10",
         "+hydra.callbacks.x._target_=pathlib.Path.touch", f"+hydra.callbacks.x.self={marker}"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert not marker.exists()
    assert len(lines) == 1 and "dpbench-audit: error: hydra.callbacks.x._target_" in lines[0]
    assert not (tmp_path / "outputs").exists()


def _shared_experiment(tmp_path: Path, hydra_yaml: str) -> Path:
    """Write a colleague's ``experiment/shared.yaml`` setting ``hydra:`` keys; return its dir."""
    folder = tmp_path / "shared"
    (folder / "experiment").mkdir(parents=True)
    (folder / "experiment" / "shared.yaml").write_text(
        "# @package _global_\nhydra:\n" + textwrap.indent(textwrap.dedent(hydra_yaml), "  "))
    return folder


LOGGING_PAYLOADS = [
    # a filter's factory (dictConfig calls any "()")
    ("""
     job_logging:
       filters:
         f: {"()": pathlib.Path.touch, self: MARKER}
     """, "hydra.job_logging.filters.f.()='pathlib.Path.touch'"),
    # a handler's factory in Hydra's own logging
    ("""
     hydra_logging:
       handlers:
         h: {"()": pathlib.Path.touch, self: MARKER}
     """, "hydra.hydra_logging.handlers.h.()='pathlib.Path.touch'"),
    # a formatter's factory
    ("""
     job_logging:
       formatters:
         f: {"()": pathlib.Path.touch, self: MARKER}
     """, "hydra.job_logging.formatters.f.()='pathlib.Path.touch'"),
    # a file handler: mode w truncates any file the user can write
    ("""
     job_logging:
       handlers:
         h: {class: logging.FileHandler, filename: MARKER, mode: w}
     """, "hydra.job_logging.handlers.h.class='logging.FileHandler'"),
    # ext:// imports any module and resolves any name
    ("""
     job_logging:
       handlers:
         h: {class: logging.StreamHandler, stream: "ext://os.environ"}
     """, "hydra.job_logging.handlers.h.stream='ext://os.environ'"),
]


@pytest.mark.parametrize("choose", [["experiment=shared"], ["-m", "experiment=null,shared"],
                                    ["hydra.mode=MULTIRUN", "experiment=null,shared"]])
@pytest.mark.parametrize(("payload", "key"), LOGGING_PAYLOADS)
def test_a_logging_factory_in_a_shared_config_never_runs(tmp_path, monkeypatch, capfd,
                                                         payload, key, choose):
    """Also when only the second job of a sweep (``-m`` or ``hydra.mode=MULTIRUN``) would
    compose it: the launcher configures every job's logging again."""
    marker = tmp_path / "payload-ran"
    shared = _shared_experiment(tmp_path, payload.replace("MARKER", str(marker)))
    monkeypatch.chdir(tmp_path)
    code, err = _main(monkeypatch, capfd, ["--config-dir", str(shared), *choose, *BASE,
                                           *QUIET_CLI])
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith(f"dpbench: error: {key}"), err
    assert not marker.exists()
    assert not (tmp_path / "outputs").exists()


def test_a_shared_config_with_a_callback_is_refused(tmp_path, monkeypatch, capfd):
    marker = tmp_path / "payload-ran"
    shared = _shared_experiment(tmp_path, f"""
        callbacks:
          x: {{_target_: pandas.read_pickle, filepath_or_buffer: {marker}}}
        """)
    monkeypatch.chdir(tmp_path)
    code, err = _main(monkeypatch, capfd, ["--config-dir", str(shared), "experiment=shared",
                                           *BASE, *QUIET_CLI])
    assert code == 2 and len(err) == 1, err
    assert "hydra.callbacks.x._target_='pandas.read_pickle' is not an allowed factory" in err[0]
    assert not (tmp_path / "outputs").exists()


def test_hydra_output_subdir_is_refused(tmp_path, monkeypatch, capfd):
    run_dir, victim = tmp_path / "run", tmp_path / "victim.txt"
    (run_dir / ".hydra").mkdir(parents=True)
    victim.write_text("keep me\n")
    (run_dir / ".hydra" / "config.yaml").symlink_to(victim)
    monkeypatch.chdir(tmp_path)
    code, err = _main(monkeypatch, capfd, [*BASE, *QUIET_CLI, "hydra.output_subdir=.hydra",
                                           f"hydra.run.dir={run_dir}"])
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("dpbench: error: hydra.output_subdir='.hydra' is refused")
    assert victim.read_text() == "keep me\n"


def test_experimental_rerun_is_refused(tmp_path, monkeypatch, capfd):
    pickled = tmp_path / "config.pickle"
    pickled.write_bytes(b"not read")
    monkeypatch.chdir(tmp_path)
    code, err = _main(monkeypatch, capfd, ["--experimental-rerun", str(pickled)])
    assert code == 2 and len(err) == 1 and "--experimental-rerun is refused" in err[0], err


@pytest.mark.parametrize("args", [[], ["-m", "seed=0,1", "method=dpsgd,dpadam"],
                                  ["hydra/job_logging=disabled", "hydra/hydra_logging=none"]])
def test_the_package_configs_pass_the_guard(args):
    check_hydra_command(args, CONF_DIR, "config", "dpbench.cli")
    check_hydra_command(args[:1] if args[:1] == ["-m"] else [], CONF_DIR, "audit",
                        "dpbench.audit.cli")


@pytest.mark.parametrize(("override", "key"), [
    # Hydra's file log: a FileHandler (dpbench writes run.log itself)
    ("hydra/job_logging=default", "hydra.job_logging.handlers.file.class='logging.FileHandler'"),
    # a class known only when the run starts is checked as written, and refused
    ("+hydra.job_logging.handlers.x.class=${oc.env:DPBENCH_TEST_UNSET_NAME}",
     "hydra.job_logging.handlers.x.class='${oc.env:DPBENCH_TEST_UNSET_NAME}'"),
])
def test_logging_values_known_only_later_are_checked_as_written(monkeypatch, override, key):
    monkeypatch.delenv("DPBENCH_TEST_UNSET_NAME", raising=False)
    with pytest.raises(ConfigError) as err:
        check_hydra_command([override], CONF_DIR, "config", "dpbench.cli")
    assert str(err.value).startswith(key)


def test_logging_config_rules():
    ok = {"version": 1, "formatters": {"f": {"format": "%(message)s"}},
          "handlers": {"c": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr"},
                       "n": {"class": "logging.NullHandler"}},
          "root": {"handlers": ["c"]}}
    check_logging_config(ok, "hydra.job_logging")
    bad = {"handlers": {"c": {"class": "logging.handlers.SocketHandler", "host": "x"}}}
    with pytest.raises(ConfigError, match=r"hydra.job_logging.handlers.c.class="):
        check_logging_config(bad, "hydra.job_logging")


def test_dpbench_tune_composition_instantiates_no_callback(tmp_path):
    """dpbench-tune composes with the compose API, which never instantiates hydra.callbacks
    nor configures logging: the payload stays inert."""
    marker = tmp_path / "payload-ran"
    compose_config("+hydra.callbacks.x._target_=pathlib.Path.touch",
                   f"+hydra.callbacks.x.self={marker}")
    assert not marker.exists()


# --- files planted in a run folder -----------------------------------------------------------

def _snapshot(folder: Path) -> dict[str, str]:
    return {p.name: (os.readlink(p) if p.is_symlink() else p.read_bytes().hex())
            for p in folder.iterdir()}


def test_a_planted_run_log_link_is_never_followed(tmp_path, monkeypatch, capfd):
    run_dir, victim = tmp_path / "run", tmp_path / "victim.txt"
    run_dir.mkdir()
    victim.write_text("keep me\n")
    (run_dir / "run.log").symlink_to(victim)
    before = _snapshot(run_dir)
    code = run_cli(hydra_main, [*BASE, f"hydra.run.dir={run_dir}"], monkeypatch)
    err = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1, err
    assert "run.log: a symbolic link, not followed" in err[0]
    assert victim.read_text() == "keep me\n"
    assert _snapshot(run_dir) == before  # nothing left behind (config.yaml removed again)


def test_a_planted_reliability_diagram_link_is_replaced_not_followed(tmp_path, monkeypatch,
                                                                     capfd):
    run_dir, victim = tmp_path / "run", tmp_path / "victim.png"
    run_dir.mkdir()
    victim.write_text("keep me\n")
    (run_dir / "reliability.png").symlink_to(victim)
    code = run_cli(hydra_main, [*BASE, f"hydra.run.dir={run_dir}"], monkeypatch)
    assert code == 0, capfd.readouterr().err[-2000:]
    assert victim.read_text() == "keep me\n"
    diagram = run_dir / "reliability.png"
    assert not diagram.is_symlink() and diagram.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("name", ["checkpoint.pt", "results.json"])
def test_a_fifo_in_place_of_a_resumed_file_is_one_line(tmp_path, monkeypatch, capfd, name):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.mkfifo(run_dir / name)

    def hung(signum, frame):
        raise AssertionError(f"reading the FIFO {name} blocked")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)
    try:
        code = run_cli(hydra_main, [*BASE, "trainer.resume=true", f"hydra.run.dir={run_dir}"],
                       monkeypatch)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    err = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1, err
    assert f"{name} is not a regular file" in err[0]
    assert sorted(p.name for p in run_dir.iterdir()) == [name]


# --- settings and messages -------------------------------------------------------------------

def test_more_threads_than_the_machine_can_use_are_refused(tmp_path, monkeypatch, capfd):
    too_many = 4 * available_cores() + 1
    run_dir = tmp_path / "run"
    code = run_cli(hydra_main, [*BASE, f"trainer.num_threads={too_many}",
                                f"hydra.run.dir={run_dir}"], monkeypatch)
    err = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1, err
    assert f"trainer.num_threads must be an integer in [1, {4 * available_cores()}]" in err[0]
    assert not run_dir.exists()


def _planted_method_plugin(folder: Path, marker: Path) -> None:
    """Plant what ``python -m`` finds on sys.path: a module and a dist-info naming it as an
    entry point of every dpbench registry."""
    (folder / "planted_plugin.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    dist = folder / "planted_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: planted-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("".join(
        f"[dpbench.{group}]\nplanted = planted_plugin:X\n"
        for group in ("methods", "models", "datasets", "tasks")))


@pytest.mark.processes  # a fresh interpreter: make test-processes
def test_python_m_dpbench_imports_no_planted_entry_point(tmp_path):
    """``python -m`` puts the current folder on sys.path; a run naming built-ins only never
    imports an entry point from it."""
    marker = tmp_path / "payload-ran"
    _planted_method_plugin(tmp_path, marker)
    proc = subprocess.run([sys.executable, "-m", "dpbench", *BASE, *QUIET_CLI, "--cfg", "job"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not marker.exists()


@pytest.mark.processes  # a fresh interpreter: make test-processes
@pytest.mark.parametrize("module", ["dpbench", "dpbench.audit"])
def test_python_m_imports_nothing_from_the_start_folder(tmp_path, module):
    """Hydra's plugin discovery imports every module of every ``hydra_plugins`` package on
    sys.path; ``python -m`` must not make the current folder one of them."""
    marker = tmp_path / "payload-ran"
    (tmp_path / "hydra_plugins").mkdir()
    (tmp_path / "hydra_plugins" / "planted.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n")
    proc = subprocess.run([sys.executable, "-m", module, *QUIET_CLI, "--cfg", "job"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not marker.exists()


@pytest.mark.slow
def test_a_run_of_built_ins_imports_no_planted_entry_point(tmp_path):
    marker = tmp_path / "payload-ran"
    _planted_method_plugin(tmp_path, marker)
    proc = subprocess.run([sys.executable, "-m", "dpbench", *BASE, *QUIET_CLI,
                           f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not marker.exists()
    # a name that is not built in does load the entry points (and the planted one runs)
    proc = subprocess.run([sys.executable, "-m", "dpbench", *BASE, *QUIET_CLI,
                           "method=plugin", "method.name=no_such_method",
                           f"hydra.run.dir={tmp_path / 'run2'}"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and marker.exists()


class _Rank1:
    """Rank 1 of two, receiving rank 0's state (``Collective``'s interface for the sync)."""

    rank, world_size, distributed, is_main = 1, 2, True, False

    def __init__(self, data: bytes) -> None:
        self.data = data

    def bytes_from_main(self, data: bytes) -> bytes:
        return self.data


def test_a_rank_with_other_settings_is_told_so(tmp_path):
    from dpbench.experiment import build_trainer
    from dpbench.training.checkpoint import state_bytes
    from dpbench.training.run_state import run_state

    main_rank = build_trainer(compose_config(*BASE), None)
    other = build_trainer(compose_config(*BASE, "privacy.clip_norm=0.5"), None)
    other.collective = _Rank1(state_bytes({"resumed": False, "state": run_state(main_rank)}))
    with pytest.raises(ConfigError, match="this rank composed another configuration than rank "
                                          "0") as err:
        other.checkpoint.sync_from_main(other)
    assert "checkpoint" not in str(err.value)


@pytest.mark.slow
def test_sigterm_to_torchrun_saves_the_checkpoint_and_the_run_resumes(tmp_path):
    """torchrun's own exit code is 1 (its SignalException); the ranks stop at one step, rank
    0 saves the checkpoint and prints the preempted line, and the run resumes to the end."""
    import json
    import time

    run_dir = tmp_path / "run"
    overrides = [*BASE, "model=mlp", "trainer.epochs=3", "trainer.batch_size=32",
                 "trainer.num_threads=1", *QUIET_CLI]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node=2", "-m", "dpbench"]
    env = {key: value for key, value in _env().items()
           if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.Popen([*torchrun, *overrides, f"hydra.run.dir={run_dir}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=tmp_path)
    try:
        deadline = time.time() + 600
        while not (run_dir / "checkpoint.pt").exists():  # the first epoch is done
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-2000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1  # torchrun's, documented in docs/distributed.md
    preempted = [line for line in err.splitlines() if line.startswith("dpbench: preempted at")]
    assert len(preempted) == 1, err[-3000:]
    assert not [line for line in err.splitlines() if line.startswith("dpbench: error")]
    assert json.loads((run_dir / "results.json").read_text())["status"] != "completed"
    resumed = subprocess.run([*torchrun, *overrides, "trainer.resume=true",
                              f"hydra.run.dir={run_dir}"], capture_output=True, text=True,
                             timeout=900, env=env, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "completed"
    assert [c["when"] for c in record["engine_check"]["checks"]] == ["start", "resume"]
