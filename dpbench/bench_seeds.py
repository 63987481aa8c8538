"""``dpbench-bench --seeds N``: seeds per CPU-minute of a seed sweep, alone vs grouped.

The demo cell (digits, MLP, DP-SGD at epsilon 3) swept over N seeds twice, each time the way
a user runs it: ``dpbench -m seed=0,...,N-1`` in a fresh process, once with each seed alone
(``trainer.seeds_at_once=1``) and once with the seeds trained K at a time
(``trainer.seeds_at_once=K``, ``training/seed_group.py``). Each sweep's CPU time is the
child process's user + system time (``resource.getrusage(RUSAGE_CHILDREN)``): start-up,
configuration, every job's checks and records, and training, all of it. The two arms run
``--seed-rounds`` times in alternating order in one ``dpbench-bench`` process, so load hits
both alike; the ratio is the median over rounds.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: the demo cell, quiet: no W&B, no progress bar (``make demo`` runs the first seed of it)
DEMO_CELL = ("logger=none", "trainer.progress=false")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_sweep(seeds: int, at_once: int, folder: Path, cell: tuple[str, ...] = DEMO_CELL
              ) -> tuple[float, float, int]:
    """Run ``dpbench -m seed=0..seeds-1 trainer.seeds_at_once=at_once`` in a fresh process;
    return (its CPU seconds, wall seconds, completed records)."""
    sweep = folder / f"sweep-{at_once}-{time.monotonic_ns()}"
    command = [sys.executable, "-m", "dpbench", "-m",
               f"seed={','.join(str(s) for s in range(seeds))}",
               f"trainer.seeds_at_once={at_once}", *cell, f"hydra.sweep.dir={sweep}"]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cpu, wall = _children_cpu(), time.perf_counter()
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    wall, cpu = time.perf_counter() - wall, _children_cpu() - cpu
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: "
                           f"{done.stderr.strip().splitlines()[-1:]}")
    completed = sum('"status": "completed"' in p.read_text()
                    for p in sweep.glob("*/results.json"))
    return cpu, wall, completed


def bench_seeds(seeds: int, at_once: int, rounds: int) -> list[dict[str, float]]:
    """Return, per round, each arm's CPU and wall seconds (arms alternate their order)."""
    out = []
    with tempfile.TemporaryDirectory(prefix="dpbench-bench-seeds-") as tmp:
        for r in range(rounds):
            row: dict[str, float] = {}
            for arm in ((1, at_once) if r % 2 == 0 else (at_once, 1)):
                cpu, wall, completed = run_sweep(seeds, arm, Path(tmp))
                if completed != seeds:
                    raise RuntimeError(f"the sweep with trainer.seeds_at_once={arm} completed "
                                       f"{completed} of {seeds} seeds")
                row[f"cpu_{arm}"], row[f"wall_{arm}"] = cpu, wall
            out.append(row)
    return out


def print_seeds_table(seeds: int, at_once: int, rounds: list[dict[str, float]]) -> None:
    """Print seeds per CPU-minute of both arms and their ratio (medians over rounds)."""
    print("\n| cell | trainer.seeds_at_once | seeds | CPU s (median) | wall s (median) "
          "| seeds / CPU-minute | vs alone |")
    print("|---|---|---|---|---|---|---|")
    alone = statistics.median(r["cpu_1"] for r in rounds)
    for arm in (1, at_once):
        cpu = statistics.median(r[f"cpu_{arm}"] for r in rounds)
        wall = statistics.median(r[f"wall_{arm}"] for r in rounds)
        ratios = [r["cpu_1"] / r[f"cpu_{arm}"] for r in rounds]
        spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
        print(f"| demo (digits mlp dpsgd eps3) | {arm} | {seeds} | {cpu:.1f} | {wall:.1f} | "
              f"{60 * seeds / cpu:.2f} | {alone / cpu:.2f}x{spread} |", flush=True)
