"""The accelerator suite (``tests/test_device.py``, marker ``device``) run on CPU in a fresh
pytest process, inside ``make test``: GPU machines are lent rarely, so the suite checks itself
on every run and cannot go stale between them (docs/engine.md, "Checking the CUDA path")."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.helpers.config import REPO

pytestmark = [pytest.mark.integration, pytest.mark.processes]


def test_the_device_suite_passes_on_cpu():
    env = {**os.environ, "DPBENCH_TEST_DEVICE": "cpu", "PYTHONPATH": str(REPO),
           "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "device", "-q",
                           "-p", "no:cacheprovider", "tests/test_device.py"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert re.search(r"^\d+ passed", summary), summary
    assert not re.search(r"failed|skipped|error|xfail|xpass", summary), summary
    assert int(summary.split()[0]) >= 14, summary  # every check of the suite was collected
