"""``dpbench -m seed=... trainer.seeds_at_once=K`` as a user runs it (runners/seed_groups.py).

Fresh processes, from a folder outside the repository: the sweep's seeds train K at a time,
each in its own folder with its own record, as a separate run of that seed would; a second
sweep with ``trainer.resume=true`` finds them completed; what cannot be grouped is refused
in one line per seed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_console_scripts import _environment

pytestmark = [pytest.mark.integration, pytest.mark.processes]

BIN = Path(sys.executable).parent
QUIET = ["logger=none", "trainer.progress=false", "trainer.epochs=1"]


def _dpbench(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "dpbench"), *args], cwd=cwd, env=dict(_environment(cwd)),
                          capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)


def _records(sweep: Path) -> dict[int, dict]:
    records = {}
    for path in sorted(sweep.glob("*/results.json")):
        record = json.loads(path.read_text())
        records[record["config"]["seed"]] = record
    return records


def test_a_seed_sweep_trains_its_seeds_in_groups_each_in_its_own_folder(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "seed=0,1,2", "trainer.seeds_at_once=2", *QUIET,
            f"hydra.sweep.dir={sweep}"]
    done = _dpbench(args, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    records = _records(sweep)
    assert sorted(records) == [0, 1, 2]  # a group of 2, then the last seed when the sweep ends
    for seed, record in records.items():
        assert record["status"] == "completed"
        assert record["grad_sample_mode"] == "seed_group"
        checks = record["engine_check"]["checks"]
        assert [(c["when"], c["engine"]) for c in checks] == [("start", "bk"),
                                                               ("grouped", "seed_group")]
        assert (sweep / next(p.name for p in sweep.iterdir()
                             if p.name.endswith(f"-s{seed}")) / "checkpoint.pt").is_file()
    assert len({r["epsilon"] for r in records.values()}) == 1
    assert len({r["metrics"]["accuracy"] for r in records.values()}) == 3  # 3 seeds' own runs
    # the same sweep resumed: every seed is found completed, nothing trains again
    again = _dpbench([*args, "trainer.resume=true"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("already completed") == 3


def test_what_cannot_be_grouped_is_refused_in_one_line_per_seed(tmp_path):
    sweep = tmp_path / "sweep"
    done = _dpbench(["-m", "seed=0,1", "trainer.seeds_at_once=2", "logger=none",
                     "trainer.progress=false", "model=logreg", "method=dpadam",
                     f"hydra.sweep.dir={sweep}"], tmp_path)
    errors = [line for line in done.stderr.splitlines() if line.startswith("dpbench: error:")]
    assert len(errors) == 2 and all("method=dpadam" in line for line in errors), done.stderr
    records = _records(sweep)
    assert all(r["status"] == "failed" for r in records.values()) and len(records) == 2
