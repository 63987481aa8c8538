"""A scheduler's signal stops a run at a step boundary with its checkpoint; the resumed run
continues the same accountant and ends exactly where a run never stopped ends.

Also a sweep through submitit's local launcher (the same numbers as the basic launcher), and
a preempted submitit job that submitit requeues and that resumes.

Only what a signal or submitit does runs in a fresh process; the uninterrupted reference (one
run, in-process, shared by every test here) and the resumes run the CLI's own entry point
in-process, at the same single torch thread, so the weights are bit-equal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from dpbench.cli import hydra_main
from dpbench.training.checkpoint import load_checkpoint
from dpbench.training.preemption import PREEMPTED_EXIT_CODE
from tests.helpers.cli import run_cli
from tests.helpers.config import QUIET

# whole runs whose object is a signal to a fresh process: make test-processes (docs/testing.md)
pytestmark = [pytest.mark.integration, pytest.mark.processes]

REPO = Path(__file__).resolve().parents[2]
RUN = ["dataset=digits", "model=mlp", "trainer.batch_size=16", "trainer.num_threads=1",
       *QUIET]
#: long enough that a signal sent just after the first epoch's checkpoint lands mid-run: on
#: an idle fast host 6 epochs left a submitit job about 0.6 s after that checkpoint, and the
#: signal sometimes found it finished
LONG = [*RUN, "trainer.epochs=12"]
#: the tests sharing the module's reference run: one xdist worker builds it once
SHARED_REFERENCE = pytest.mark.xdist_group("preemption_reference")


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _dpbench(*args: str) -> list[str]:
    return [sys.executable, "-m", "dpbench", *args]


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(_dpbench(*args), capture_output=True, text=True, timeout=300,
                          env=_env(), cwd=cwd)


def _wait_training(run_dir: Path, proc: subprocess.Popen, timeout: float = 600) -> None:
    """Wait until the run has finished its first epoch (so a signal lands mid-training)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (run_dir / "checkpoint.pt").exists():
            return
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.05)
    raise AssertionError("the run did not start training")


def _same_run(a: dict, b: dict) -> None:
    for key in ("epsilon", "privacy_ledger", "steps", "metrics", "history"):
        assert a[key] == b[key], key


def _cli(*args: str) -> int:
    """Run ``dpbench *args`` in-process (the console script's entry point); its exit code."""
    threads, environ, cwd = torch.get_num_threads(), dict(os.environ), os.getcwd()
    try:
        with pytest.MonkeyPatch.context() as monkeypatch:
            return run_cli(hydra_main, list(args), monkeypatch)
    finally:  # a module fixture outlives the per-test restore of tests/conftest.py
        torch.set_num_threads(threads)
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)


@pytest.fixture(scope="session")  # not module: another module's test between two users
def reference(tmp_path_factory) -> Path:  # (random order, xdist) would tear it down
    """The uninterrupted run (``LONG``, seed 0): its run folder."""
    run_dir = tmp_path_factory.mktemp("preemption") / "reference"
    assert _cli(*LONG, f"hydra.run.dir={run_dir}") == 0
    return run_dir


@SHARED_REFERENCE
@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_a_preempted_run_resumes_to_the_same_result(tmp_path, sig, reference):
    run_dir = tmp_path / "preempted"
    proc = subprocess.Popen(_dpbench(*LONG, f"hydra.run.dir={run_dir}"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(), cwd=tmp_path)
    _wait_training(run_dir, proc)
    time.sleep(0.3)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == PREEMPTED_EXIT_CODE, err[-2000:]
    assert "dpbench: preempted at step" in err and "Traceback" not in err
    state = load_checkpoint(run_dir / "checkpoint.pt")
    planned = json.loads((reference / "results.json").read_text())["steps"]
    assert 0 < state["step"] < planned  # stopped inside the run, at a step boundary
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "running"  # no failed record: the run is not over
    assert _cli(*LONG, f"hydra.run.dir={run_dir}", "trainer.resume=true") == 0
    _same_run(json.loads((run_dir / "results.json").read_text()),
              json.loads((reference / "results.json").read_text()))
    one = load_checkpoint(reference / "checkpoint.pt")["model"]
    two = load_checkpoint(run_dir / "checkpoint.pt")["model"]
    assert all(torch.equal(one[k], two[k]) for k in one)  # the same steps, draws and noise


def _results(sweep: Path) -> dict[int, dict]:
    out = {}
    for path in sweep.glob("*/results.json"):
        record = json.loads(path.read_text())
        out[record["seed"]] = record
    return out


def test_a_submitit_local_sweep_gives_the_basic_launchers_numbers(tmp_path):
    sweep = [*RUN, "trainer.epochs=2", "seed=0,1"]
    assert _cli("-m", *sweep, f"hydra.sweep.dir={tmp_path / 'basic'}") == 0  # in-process
    local = _run("-m", *sweep, "hydra/launcher=submitit_local",
                 "hydra.launcher.timeout_min=10", f"hydra.sweep.dir={tmp_path / 'submitit'}",
                 cwd=tmp_path)
    assert local.returncode == 0, local.stderr[-2000:]
    got, ref = _results(tmp_path / "submitit"), _results(tmp_path / "basic")
    assert sorted(got) == sorted(ref) == [0, 1]
    for seed in ref:
        assert got[seed]["status"] == "completed"
        _same_run(got[seed], ref[seed])


@SHARED_REFERENCE
def test_a_preempted_submitit_job_is_requeued_and_resumes(tmp_path, reference):
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.Popen(
        _dpbench("-m", *LONG, "seed=0", "trainer.resume=true", "hydra/launcher=submitit_local",
                 "hydra.launcher.timeout_min=10", f"hydra.sweep.dir={sweep_dir}"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path)
    deadline, jobs = time.time() + 600, []
    while time.time() < deadline and not jobs:  # the job process, found before it trains
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if "submitit.core._submit" in " ".join(child.cmdline()):
                    jobs.append(child)
            except psutil.Error:
                pass
        time.sleep(0.05)
    assert jobs, "the submitit job did not start"
    while time.time() < deadline and not list(sweep_dir.glob("*/checkpoint.pt")):
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.01)
    (job,) = jobs
    job.send_signal(signal.SIGUSR2)  # submitit's preemption signal, just after epoch 1
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    logs = "\n".join(p.read_text() for p in sweep_dir.rglob("*_log.err"))
    assert "preempted at step" in logs and "Requeued job" in logs, logs[-3000:]
    (run_dir,) = [p.parent for p in sweep_dir.glob("*/results.json")]
    got = json.loads((run_dir / "results.json").read_text())
    assert got["status"] == "completed"
    assert [c["when"] for c in got["engine_check"]["checks"]] == ["start", "resume"]
    _same_run(got, json.loads((reference / "results.json").read_text()))


# A launcher's SIGTERM arriving while a failure is being recorded: torchrun stops the other
# ranks as soon as one dies, often just after the survivor's collective has failed. The run
# here fails at its third step; the SIGTERM comes while its failed record is being written.
_SIGTERM_WHILE_RECORDING = """
import os, signal, sys
import dpbench.cli as cli
import dpbench.runners.job_errors as job_errors
from dpbench.training.loop import Trainer
from dpbench.errors import DPBenchError

step = Trainer.train_step
def failing_step(self, batch):
    if self.step == 2:
        raise DPBenchError("rank 0 of 2: lost contact with another rank (test)")
    return step(self, batch)
Trainer.train_step = failing_step

write = job_errors.write_record
def write_under_sigterm(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    return write(*args, **kwargs)
job_errors.write_record = write_under_sigterm

sys.argv = ["dpbench", *sys.argv[1:]]
cli.main()
"""


def test_a_sigterm_while_a_failure_is_recorded_waits_for_the_record_and_the_line(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", _SIGTERM_WHILE_RECORDING, *RUN,
                           f"hydra.run.dir={run_dir}"], capture_output=True, text=True,
                          timeout=300, env=_env(), cwd=tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("dpbench: error:")]
    assert lines == ["dpbench: error: rank 0 of 2: lost contact with another rank (test)"], \
        proc.stderr[-2000:]
    record = json.loads((run_dir / "results.json").read_text())  # complete
    assert record["status"] == "failed"
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]
    assert proc.returncode == -signal.SIGTERM  # the signal is deferred, never dropped
