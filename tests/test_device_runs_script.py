"""``scripts/device_runs.sh`` (the console-script runs of a GPU session) as a GPU session runs
it, here on CPU (``trainer.device=auto`` finds no GPU): every run completes and writes its line.
Slow (about 75 s on 2 cores): ``make test-full``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.config import REPO

pytestmark = [pytest.mark.slow, pytest.mark.processes]


def test_device_runs_script_completes_every_run_on_cpu(tmp_path):
    bindir = str(Path(sys.executable).parent)  # python3 there: the one running the tests
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    env.pop("DPBENCH_DATA_ROOT", None)
    proc = subprocess.run(["bash", str(REPO / "scripts" / "device_runs.sh"), str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    log = (tmp_path / "runs.log").read_text()
    assert proc.returncode == 0, log[-4000:] + proc.stderr[-2000:]
    lines = [json.loads(x) for x in (tmp_path / "runs.jsonl").read_text().splitlines()]
    runs = {x["run"] for x in lines}
    assert len(runs) == 15 and len(lines) == 18, runs  # the seed group: one line a seed
    assert all(x["rc"] == 0 and x["status"] == "completed" for x in lines), lines
    assert all(0 < x["epsilon"] <= 3.0 for x in lines)  # every run's default target: eps 3
