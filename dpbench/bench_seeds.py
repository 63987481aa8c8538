"""``dpbench-bench --seeds N``: seeds per CPU-minute of a seed sweep, alone vs grouped.

The demo cell (digits, MLP, DP-SGD at epsilon 3) swept over N seeds twice, each time the way
a user runs it: ``dpbench -m seed=0,...,N-1`` in a fresh process, once with each seed alone
(``trainer.seeds_at_once=1``) and once with the seeds trained K at a time
(``trainer.seeds_at_once=K``, ``training/seed_group.py``). Each sweep's CPU time is the
child process's user + system time (``resource.getrusage(RUSAGE_CHILDREN)``): start-up,
configuration, every job's checks and records, and training, all of it. The two arms run
``--seed-rounds`` times in alternating order in one ``dpbench-bench`` process, so load hits
both alike; the ratio is the median over rounds.

``--mia-references R`` does the same for a membership-inference cell (the demo cell attacked
by ``dpbench-mia``: 1 target and R reference models, ``conf/mia/default.yaml``'s pool): one
``python -m dpbench.audit.mia`` process with each model trained alone, and one with all
R + 1 models trained together; its figure is models per CPU-minute.

Each round also times the floor (``bench_startup.floor_command``: a fresh Python importing
only the libraries a run imports before its first step). Alone / floor is the most any
grouping of that cell could gain: a sweep that paid nothing but those imports.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from dpbench.bench_startup import floor_command

#: the demo cell, quiet: no W&B, no progress bar (``make demo`` runs the first seed of it)
DEMO_CELL = ("logger=none", "trainer.progress=false")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(command: list[str], folder: Path) -> tuple[float, float]:
    """Run ``command`` in a fresh process in ``folder``; return its (CPU s, wall s)."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cpu, wall = _children_cpu(), time.perf_counter()
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    wall, cpu = time.perf_counter() - wall, _children_cpu() - cpu
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: "
                           f"{done.stderr.strip().splitlines()[-1:]}")
    return cpu, wall


def run_sweep(seeds: int, at_once: int, folder: Path, cell: tuple[str, ...] = DEMO_CELL
              ) -> tuple[float, float, int]:
    """Run ``dpbench -m seed=0..seeds-1 trainer.seeds_at_once=at_once`` in a fresh process;
    return (its CPU seconds, wall seconds, completed records)."""
    sweep = folder / f"sweep-{at_once}-{time.monotonic_ns()}"
    command = [sys.executable, "-m", "dpbench", "-m",
               f"seed={','.join(str(s) for s in range(seeds))}",
               f"trainer.seeds_at_once={at_once}", *cell, f"hydra.sweep.dir={sweep}"]
    cpu, wall = _timed(command, folder)
    completed = sum('"status": "completed"' in p.read_text()
                    for p in sweep.glob("*/results.json"))
    return cpu, wall, completed


def run_mia_cell(references: int, at_once: int, folder: Path) -> tuple[float, float, int]:
    """Run ``dpbench-mia mia.references=R trainer.seeds_at_once=at_once`` (the demo cell) in
    a fresh process; return (its CPU seconds, wall seconds, models trained)."""
    run_dir = folder / f"mia-{at_once}-{time.monotonic_ns()}"
    command = [sys.executable, "-m", "dpbench.audit.mia", f"mia.references={references}",
               f"trainer.seeds_at_once={at_once}", *DEMO_CELL, f"hydra.run.dir={run_dir}"]
    cpu, wall = _timed(command, folder)
    record = json.loads((run_dir / "results.json").read_text())
    done = record.get("status") == "completed" and record.get("kind") == "mia"
    return cpu, wall, len(record["mia"]["model_epsilons"]) if done else 0


def _rounds(run_arm: Callable[[int, Path], tuple[float, float, int]], count: int,
            at_once: int, rounds: int, what: str) -> list[dict[str, float]]:
    """Return, per round, each arm's CPU and wall seconds (arms alternate their order)."""
    out = []
    with tempfile.TemporaryDirectory(prefix="dpbench-bench-seeds-") as tmp:
        for r in range(rounds):
            row: dict[str, float] = {}
            for arm in ((1, at_once) if r % 2 == 0 else (at_once, 1)):
                cpu, wall, completed = run_arm(arm, Path(tmp))
                if completed != count:
                    raise RuntimeError(f"{what} with trainer.seeds_at_once={arm} completed "
                                       f"{completed} of {count}")
                row[f"cpu_{arm}"], row[f"wall_{arm}"] = cpu, wall
            row["cpu_floor"], row["wall_floor"] = _timed(floor_command(), Path(tmp))
            out.append(row)
    return out


def bench_seeds(seeds: int, at_once: int, rounds: int) -> list[dict[str, float]]:
    """Return, per round, each arm's CPU and wall seconds of the demo cell's seed sweep."""
    return _rounds(lambda arm, folder: run_sweep(seeds, arm, folder), seeds, at_once, rounds,
                   "the sweep")


def bench_mia(references: int, rounds: int) -> list[dict[str, float]]:
    """Return, per round, each arm's CPU and wall seconds of the MIA cell with
    ``references`` reference models (its 1 + R models alone, or all at once)."""
    models = references + 1
    return _rounds(lambda arm, folder: run_mia_cell(references, arm, folder), models, models,
                   rounds, "the MIA cell")


def print_seeds_table(seeds: int, at_once: int, rounds: list[dict[str, float]],
                      cell: str = "demo (digits mlp dpsgd eps3)", unit: str = "seeds") -> None:
    """Print ``unit`` (seeds, or an MIA cell's models) per CPU-minute of both arms and their
    ratio (medians over rounds), then, where the rounds timed it, the floor's row: the most
    any grouping could gain, alone / floor (median over rounds)."""
    print(f"\n| cell | trainer.seeds_at_once | {unit} | CPU s (median) | wall s (median) "
          f"| {unit} / CPU-minute | vs alone |")
    print("|---|---|---|---|---|---|---|")
    alone = statistics.median(r["cpu_1"] for r in rounds)
    for arm in (1, at_once):
        cpu = statistics.median(r[f"cpu_{arm}"] for r in rounds)
        wall = statistics.median(r[f"wall_{arm}"] for r in rounds)
        ratios = [r["cpu_1"] / r[f"cpu_{arm}"] for r in rounds]
        spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
        print(f"| {cell} | {arm} | {seeds} | {cpu:.1f} | {wall:.1f} | "
              f"{60 * seeds / cpu:.2f} | {alone / cpu:.2f}x{spread} |", flush=True)
    if all("cpu_floor" in r for r in rounds):
        cpu = statistics.median(r["cpu_floor"] for r in rounds)
        wall = statistics.median(r["wall_floor"] for r in rounds)
        ceilings = [r["cpu_1"] / r["cpu_floor"] for r in rounds]
        spread = f" ({min(ceilings):.2f}-{max(ceilings):.2f})" if len(ceilings) > 1 else ""
        print(f"| the floor: the libraries a run imports, nothing else | — | — | {cpu:.1f} | "
              f"{wall:.1f} | — | at most {statistics.median(ceilings):.2f}x{spread} |",
              flush=True)
