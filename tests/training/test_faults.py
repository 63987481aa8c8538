"""Fault tolerance: SIGKILL and resume, NaN handling, atomic writes, failing sweep jobs."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dpbench.cli import hydra_main
from dpbench.errors import TrainingDiverged
from dpbench.experiment import build_trainer
from dpbench.training.checkpoint import CHECKPOINT_NAME, load_checkpoint
from dpbench.utils.io import atomic_write_json
from tests.helpers.cli import QUIET_CLI, run_cli
from tests.helpers.config import REPO, compose_config
from tests.helpers.wrapped import build_wrapped, poisoned_at

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

RUN = ("model.hidden=16", "trainer.batch_size=32", "trainer.epochs=3")


def _cli(run_dir: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    # the in-process reference's thread count (one per xdist worker): float sums round alike
    threads = f"trainer.num_threads={torch.get_num_threads()}"
    return subprocess.Popen([sys.executable, "-m", "dpbench", *QUIET_CLI, *RUN, *extra,
                             threads, f"hydra.run.dir={run_dir}"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.processes  # a signal to a fresh process: make test-processes
def test_sigkill_mid_run_then_resume_matches_an_uninterrupted_run(tmp_path):
    reference_dir = tmp_path / "reference"
    reference = build_trainer(compose_config(*RUN), reference_dir).fit()

    killed_dir = tmp_path / "killed"
    proc = _cli(killed_dir)
    checkpoint = killed_dir / CHECKPOINT_NAME
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    # frozen the moment epoch 1's checkpoint appears, then killed: mid-run however fast an
    # epoch is (a sleep before the kill let a fast machine finish all three epochs)
    proc.send_signal(signal.SIGSTOP)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    state = load_checkpoint(checkpoint)  # loads: never truncated
    assert 1 <= state["epoch"] < 3
    if (killed_dir / "results.json").exists():
        interim = json.loads((killed_dir / "results.json").read_text())  # valid JSON
        assert interim["status"] == "running"

    proc = _cli(killed_dir, "trainer.resume=true")
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    resumed = json.loads((killed_dir / "results.json").read_text())
    assert resumed["status"] == "completed"
    assert [row["epoch"] for row in resumed["history"]] == [1, 2, 3]  # none lost or doubled
    assert resumed["steps"] == reference["steps"] == resumed["planned_steps"]
    assert sum(e["steps"] for e in resumed["privacy_ledger"]) == reference["steps"]
    assert resumed["epsilon"] == pytest.approx(reference["epsilon"], rel=1e-12)
    assert resumed["metrics"]["accuracy"] == reference["metrics"]["accuracy"]
    final = load_checkpoint(checkpoint)["model"]
    expected = load_checkpoint(reference_dir / CHECKPOINT_NAME)["model"]
    assert all(torch.equal(final[k], expected[k]) for k in expected)
    assert [r["epsilon"] for r in resumed["history"]] == pytest.approx(
        [r["epsilon"] for r in reference["history"]], rel=1e-12)


def _poisoned(overrides, run_dir, bad_steps):
    """Return the run of ``overrides`` whose update turns the weights NaN after ``bad_steps``
    (a fault, not a config; an update wrapper, tests/helpers/wrapped.py).

    A NaN *example* is dropped before the noise and never stops a run
    (tests/training/test_nonfinite.py); only released quantities and their post-processing,
    such as the updated weights, decide.
    """
    return build_wrapped(compose_config(*overrides), run_dir, update=poisoned_at(bad_steps))


def test_nan_stops_with_a_clear_message_and_keeps_the_last_good_checkpoint(tmp_path):
    per_epoch = build_trainer(compose_config(*RUN), None).plan.steps_per_epoch
    trainer = _poisoned(RUN, tmp_path, {per_epoch + 3})  # in epoch 2
    with pytest.raises(TrainingDiverged, match="non-finite released gradient or update at step"):
        trainer.fit()
    state = load_checkpoint(tmp_path / CHECKPOINT_NAME)
    assert state["epoch"] == 1 and state["step"] == per_epoch
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    assert state["accountant"]["history"]  # the good epoch's spending is kept


def test_nan_skip_skips_the_update_but_accounts_the_step(tmp_path):
    clean = build_trainer(compose_config(*RUN, "trainer.epochs=1"), None).fit()
    trainer = _poisoned([*RUN, "trainer.epochs=1", "trainer.nonfinite=skip"], None, {2, 5})
    result = trainer.fit()
    assert result["skipped_steps"] == 2
    assert result["steps"] == clean["steps"]
    assert sum(e["steps"] for e in result["privacy_ledger"]) == clean["steps"]
    assert result["epsilon"] == pytest.approx(clean["epsilon"], rel=1e-12)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


class NaNAfterStepSGD(torch.optim.SGD):
    """SGD whose every step leaves NaN weights: a fault (``lr=nan`` is refused at setup)."""

    def step(self, closure=None):
        out = super().step(closure)
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    p.fill_(math.nan)
        return out


NAN_SGD = f"method.optimizer._target_={__name__}.NaNAfterStepSGD"


def test_nan_through_the_cli_exits_1_with_a_failed_record(tmp_path, monkeypatch, capfd):
    run_dir = tmp_path / "run"
    code = run_cli(hydra_main, [*RUN, "trainer.epochs=1", NAN_SGD,
                                  f"hydra.run.dir={run_dir}"], monkeypatch)
    assert code == 1
    assert "non-finite released gradient or update" in capfd.readouterr().err
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "failed" and record["error"].startswith("TrainingDiverged")


def test_atomic_write_keeps_the_old_file_when_a_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    atomic_write_json(path, {"status": "running", "epoch": 1})
    before = path.read_bytes()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # a signal between the write and the rename

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_json(path, {"status": "completed", "epoch": 2, "pad": "x" * 100000})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temp file left


_WRITER = """
import sys
from dpbench.utils.io import atomic_write_json
i = 0
while True:
    atomic_write_json(sys.argv[1], {"i": i, "pad": [i] * 200000})
    i += 1
"""


@pytest.mark.processes  # a signal to a fresh process: make test-processes
def test_sigkill_during_writes_never_leaves_truncated_json(tmp_path):
    path = tmp_path / "results.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for delay in (0.3, 0.55, 0.8):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], env=env)
        deadline = time.monotonic() + 120
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        record = json.loads(path.read_text())  # complete, whatever the moment of the kill
        assert record["pad"] == [record["i"]] * 200000


def test_a_failing_sweep_job_does_not_stop_the_others(tmp_path, monkeypatch):
    """Bad config (batch > N), a crash (no such device) and a NaN loss next to a good job."""
    sweep = tmp_path / "sweep"
    code = run_cli(hydra_main, [
        "-m", "model.hidden=16", "trainer.epochs=1", "trainer.batch_size=64,5000",
        f"method.optimizer._target_=torch.optim.SGD,{__name__}.NaNAfterStepSGD",
        "trainer.device=cpu,cuda:99",
        f"hydra.sweep.dir={sweep}"], monkeypatch, quiet=("logger=none", "trainer.progress=false"))
    assert code == 0
    records = {}
    for path in sweep.glob("*/results.json"):
        cfg = (r := json.loads(path.read_text()))["config"]
        optimizer = cfg["method"]["optimizer"]["_target_"].rsplit(".")[-1]
        records[(cfg["trainer"]["batch_size"], optimizer, cfg["trainer"]["device"])] = r
    assert len(records) == 8  # every job left a record
    assert records[(64, "SGD", "cpu")]["status"] == "completed"
    nan = records[(64, "NaNAfterStepSGD", "cpu")]
    assert nan["status"] == "failed" and nan["error"].startswith("TrainingDiverged")
    for opt in ("SGD", "NaNAfterStepSGD"):
        crash = records[(64, opt, "cuda:99")]
        assert crash["status"] == "failed" and crash["failed_stage"] == "setup"
        bad = records[(5000, opt, "cpu")]
        assert bad["status"] == "failed" and "trainer.batch_size must be <= N" in bad["error"]
        # a missing device is refused first, before the data-dependent batch check
        assert "trainer.device=cuda:99" in records[(5000, opt, "cuda:99")]["error"]
    from dpbench.analysis.report import build_report

    _, markdown = build_report(sweep)  # the report lists the failures with their errors
    assert markdown.count("\n- ") == 7 and "TrainingDiverged" in markdown
