"""Every file a console script writes goes through one writer: atomic, never through a planted
symbolic link, never into a FIFO (docs/reliability-bad-input.md, "Files a command writes").

For each script the test first runs it as a user does (a fresh process, from outside the
repository) and lists every file it wrote. It then plants, at each of those paths, a link to a
file outside the folder (one run) and a FIFO (another run), and runs the script again: it must
not hang, must leave every link's target as it was, and either replace what was planted with a
regular file or refuse in one line naming it. A refused path is taken away and the script run
again, so every path is tried.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.processes]

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
QUIET = ["logger=none", "trainer.progress=false", "trainer.epochs=1"]
TIMEOUT_S = 300


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", WANDB_MODE="offline", PYTHONPATH=str(REPO))
    env.pop("DPBENCH_DATA_ROOT", None)
    return env


def _run(script: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / script), *args], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)


def _state(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.lstat().st_ino, p.lstat().st_mtime_ns)
            for p in root.rglob("*") if not p.is_dir() or p.is_symlink()}


def _tiny_sweep(folder: Path) -> None:
    """A one-run sweep folder (what dpbench-report reads), written by hand: records are
    data here, and the report reads them whether or not they verify."""
    run = folder / "0_run"
    run.mkdir(parents=True)
    record = {"status": "completed", "method": "nonprivate", "dataset": "digits",
              "model": "logreg", "seed": 0, "epsilon": float("inf"), "target_epsilon": None,
              "delta": None, "private": False, "metrics": {"accuracy": 0.9},
              "tuning": {"mode": "none"}}
    (run / "results.json").write_text(json.dumps(record))


def _reproduce_inputs(out: Path) -> None:
    (out / "reproduce" / "cpu" / "fiber").mkdir(parents=True)


# script, its arguments for an output folder OUT, what OUT must hold before it runs
SCRIPTS: list[tuple[str, Callable[[Path], list[str]], Callable[[Path], None] | None]] = [
    ("dpbench", lambda out: [*QUIET, f"hydra.run.dir={out / 'run'}"], None),
    ("dpbench-audit", lambda out: ["method=dpsgd", "privacy=eps1", *QUIET,
                                   "audit.canaries=100", f"hydra.run.dir={out / 'run'}"], None),
    ("dpbench-mia", lambda out: ["method=dpsgd", "privacy=eps1", *QUIET, "mia.pool_size=60",
                                 "mia.population_size=30", "mia.references=2",
                                 "mia.bootstrap=20", "trainer.batch_size=16",
                                 f"hydra.run.dir={out / 'run'}"], None),
    ("dpbench-report", lambda out: [str(out)], _tiny_sweep),
    ("dpbench-tune", lambda out: ["--lrs", "0.1", "--seeds", "0", "--jobs", "1", "--out",
                                  str(out), "--", *QUIET], None),
    ("dpbench-reproduce", lambda out: ["fiber", "--claims-only", "--out", str(out)],
     _reproduce_inputs),
]
#: whole training runs (three each): make test-full; report and reproduce stay in make test
SLOW = {"dpbench", "dpbench-mia", "dpbench-tune", "dpbench-audit"}


def _written(script, args, prepare, folder: Path) -> list[str]:
    out = folder / "out"
    out.mkdir(parents=True)
    if prepare:
        prepare(out)
    before = _state(out)
    done = _run(script, args(out), folder)
    assert done.returncode == 0, done.stderr[-3000:]
    after = _state(out)
    return sorted(p for p, s in after.items() if before.get(p) != s and ".lock" not in p)


def _plant(path: Path, kind: str, victims: Path, i: int) -> Path | None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
        return None
    victim = victims / f"victim-{i}"
    victim.write_text(f"keep {i}\n")
    path.symlink_to(victim)
    return victim


@pytest.mark.parametrize("kind", ["link", "fifo"])
@pytest.mark.parametrize("script", [pytest.param(s, marks=pytest.mark.slow) if s[0] in SLOW
                                    else s for s in SCRIPTS], ids=lambda s: s[0])
def test_a_planted_link_or_fifo_at_every_written_path(tmp_path, script, kind):
    name, args, prepare = script
    written = _written(name, args, prepare, tmp_path / "first")
    assert written, f"{name} wrote nothing"
    planted = list(written)
    for _attempt in range(len(written) + 1):
        folder = tmp_path / f"planted-{_attempt}"
        out, victims = folder / "out", folder / "victims"
        victims.mkdir(parents=True)
        out.mkdir()
        if prepare:
            prepare(out)
        victim_of = {p: _plant(out / p, kind, victims, i) for i, p in enumerate(planted)}
        try:
            done = _run(name, args(out), folder)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} hung on a planted {kind} among {planted}")
        for p, victim in victim_of.items():
            if victim is not None:
                assert victim.read_text() == f"keep {planted.index(p)}\n", \
                    f"{name} wrote through the link {p}"
        if done.returncode == 0:
            for p in planted:
                mode = (out / p).lstat().st_mode
                assert stat.S_ISREG(mode) or not (out / p).exists() and not (
                    out / p).is_symlink(), f"{name} left the planted {kind} {p}"
            return
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
        refused = [p for p in planted if Path(p).name in lines[0]]
        assert refused, lines
        planted = [p for p in planted if p not in refused]
        shutil.rmtree(folder)
        if not planted:
            return
    pytest.fail(f"{name} kept refusing: {planted}")
