"""Measure what a run costs besides its training, the way a user runs ``dpbench``.

Four figures, each from fresh processes (``dpbench``, the console script beside this Python;
the floor: this Python itself):

- ``dpbench --help``: wall time (median of ``--repeats``);
- the demo (``dpbench logger=none``): seconds from the command starting to its first training
  step (the ``N=... q=...`` line of ``run.log``, written just before the first step);
- a sweep of ``--seeds`` seeds of the demo (``dpbench -m seed=0,...,K-1 logger=none``): its
  wall and CPU time and the shares of them spent training, each job's training (its
  ``Trainer.fit``: the steps, the evaluations, the checkpoints and records) read from the
  ``trained in ... s (CPU ... s), after the job's set-up of ...`` line of its ``run.log``;
- the floor under the first two: a fresh Python importing only the libraries the demo imports
  before its first step (``FLOOR_MODULES``), nothing of dpbench (median of ``--repeats``).

The load average before and after is printed with the figures (the machine may be shared),
and the CPU seconds of ``--help`` and of the sweep, which a shared machine inflates less than
wall time. ``--profile`` instead profiles the sweep (``cProfile``, wall clock) and prints the
shares of training, imports and Hydra's compositions.

    python -m dpbench.bench_startup --seeds 16
    python -m dpbench.bench_startup --seeds 4 --profile
    python -m dpbench.bench_startup --scripts      # the other console scripts' --help
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

#: the run.log line written just before the first step (runners/job.py)
START_MARK = "][dpbench][INFO] N="
#: the run.log line of a finished run: its training and its set-up, wall and CPU seconds
TRAINED = re.compile(r"trained in ([\d.]+) s \(CPU ([\d.]+) s\), after the job's set-up of "
                     r"([\d.]+) s \(CPU ([\d.]+) s\)")


def _command() -> list[str]:
    script = Path(sys.executable).with_name("dpbench")
    return [str(script)] if script.exists() else [shutil.which("dpbench") or "dpbench"]


def _env() -> dict[str, str]:
    env = {**os.environ, "WANDB_MODE": "offline"}
    env.pop("DPBENCH_DATA_ROOT", None)
    return env


def _stamp(line: str) -> float:
    """Return the epoch seconds of a ``[YYYY-mm-dd HH:MM:SS,mmm]`` log line (local time)."""
    return datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _first_step(run_log: Path) -> float:
    for line in run_log.read_text().splitlines():
        if START_MARK in line:
            return _stamp(line)
    raise SystemExit(f"{run_log} has no line with {START_MARK!r}")


def _trained(run_log: Path) -> tuple[float, float, float, float]:
    """Return a run's training wall and CPU seconds, then its set-up's wall and CPU."""
    match = TRAINED.search(run_log.read_text())
    if match is None:
        raise SystemExit(f"{run_log} has no 'trained in' line")
    return tuple(float(x) for x in match.groups())  # type: ignore[return-value]


def _cpu() -> float:
    """Return the CPU seconds (user + system) of this process's finished children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(args: list[str], cwd: Path, command: list[str] | None = None) -> float:
    began = time.time()
    proc = subprocess.run((command or _command()) + args, cwd=cwd, env=_env(),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        name = Path(command[0]).name if command else "dpbench"
        raise SystemExit(f"{name} {' '.join(args)} failed: {proc.stderr[-2000:]}")
    return began


#: the libraries the demo imports before its first training step: torch; Hydra and OmegaConf
#: (the composition); Opacus (its Poisson sampler and module validator; importing any part
#: runs its package's ``__init__``, which imports all of it); dp-accounting and scipy.stats
#: (the calibration); scikit-learn's datasets (the digits loader); ``torch._dynamo``, which
#: ``torch.optim`` imports at its first optimiser. ``tests/test_startup.py`` checks that a
#: demo run imports each of them.
FLOOR_MODULES = ("torch", "hydra", "omegaconf", "opacus", "dp_accounting", "scipy.stats",
                 "sklearn.datasets", "torch._dynamo")
FLOOR = "import importlib\nfor name in {modules!r}:\n    importlib.import_module(name)\n"


def floor_command() -> list[str]:
    """Return the command of the floor: this Python importing ``FLOOR_MODULES``."""
    return [sys.executable, "-c", FLOOR.format(modules=FLOOR_MODULES)]


def floor_seconds(cwd: Path, repeats: int) -> tuple[float, float]:
    """Return the median wall and CPU seconds of a fresh Python importing ``FLOOR_MODULES``
    (this Python, the environment a run gets): what no first step or sweep can go below."""
    return _median_seconds(floor_command(), [], cwd, repeats)


def _median_seconds(command: list[str], args: list[str], cwd: Path,
                    repeats: int) -> tuple[float, float]:
    """Return the median wall and CPU seconds of ``repeats`` fresh runs of ``command args``."""
    walls, cpus = [], []
    for _ in range(repeats):
        began, cpu = time.perf_counter(), _cpu()
        _run(args, cwd, command)
        walls.append(time.perf_counter() - began)
        cpus.append(_cpu() - cpu)
    return statistics.median(walls), statistics.median(cpus)


#: the console scripts besides ``dpbench`` whose ``--help`` is measured (``--scripts``)
SCRIPTS = ("dpbench-audit", "dpbench-mia", "dpbench-report", "dpbench-tune", "dpbench-bench",
           "dpbench-reproduce")


def help_seconds(cwd: Path, repeats: int, script: str = "dpbench") -> tuple[float, float]:
    """Return the median wall and CPU seconds of ``<script> --help``."""
    return _median_seconds([str(Path(_command()[0]).with_name(script))], ["--help"], cwd,
                           repeats)


def first_step_seconds(cwd: Path) -> float:
    run_dir = cwd / "demo"
    began = _run(["logger=none", "trainer.progress=false", f"hydra.run.dir={run_dir}"], cwd)
    return _first_step(run_dir / "run.log") - began


def _sweep_args(seeds: int, sweep: Path) -> list[str]:
    return ["-m", "seed=" + ",".join(str(s) for s in range(seeds)), "logger=none",
            "trainer.progress=false", f"hydra.sweep.dir={sweep}"]


def sweep_share(cwd: Path, seeds: int) -> dict[str, float]:
    """Return the sweep's wall and CPU seconds, those of its jobs' training, and those of a
    job's set-up (the median over the jobs after the first, which pays the imports)."""
    sweep = cwd / "sweep"
    began, cpu = time.perf_counter(), _cpu()
    _run(_sweep_args(seeds, sweep), cwd)
    wall, cpu = time.perf_counter() - began, _cpu() - cpu
    runs = [_trained(run_log) for run_log in sorted(sweep.glob("*/run.log"))]
    if len(runs) != seeds:
        raise SystemExit(f"{len(runs)} of {seeds} jobs wrote a run.log")
    later = runs[1:] or runs
    return {"wall": wall, "cpu": cpu, "train_wall": sum(r[0] for r in runs),
            "train_cpu": sum(r[1] for r in runs),
            "setup_wall": statistics.median(r[2] for r in later),
            "setup_cpu": statistics.median(r[3] for r in later),
            "run_wall": statistics.median(r[0] for r in later),
            "run_cpu": statistics.median(r[1] for r in later)}


#: runs ``dpbench`` under cProfile (the sweep's process alone: the basic launcher)
PROFILE = """
import cProfile, runpy, sys
sys.argv = ["dpbench", *sys.argv[1:]]
profile = cProfile.Profile()
try:
    profile.runcall(runpy.run_module, "dpbench", run_name="__main__")
except SystemExit:
    pass
profile.dump_stats(OUT_PATH)
"""


def profile_shares(cwd: Path, seeds: int) -> dict[str, float]:
    """Profile the sweep; return the seconds in all, in ``Trainer.fit``, in imports, in
    Hydra's compositions (and how many), and in ``run_job``."""
    import pstats

    out = cwd / "sweep.prof"
    code = PROFILE.replace("OUT_PATH", repr(str(out)))
    _run(_sweep_args(seeds, cwd / "profiled"), cwd, [sys.executable, "-c", code])
    stats = pstats.Stats(str(out)).stats  # type: ignore[attr-defined]

    def cumulative(path: str, name: str) -> tuple[int, float]:
        calls = [(v[1], v[3]) for k, v in stats.items() if k[0].endswith(path) and k[2] == name]
        return (sum(c for c, _ in calls), sum(t for _, t in calls)) if calls else (0, 0.0)

    total = max(v[3] for v in stats.values())
    _, fit = cumulative("dpbench/training/loop.py", "fit")
    _, imports = cumulative("<frozen importlib._bootstrap>", "_find_and_load")
    loads, hydra = cumulative("hydra/_internal/config_loader_impl.py", "load_configuration")
    _, job = cumulative("dpbench/runners/job.py", "run_job")
    return {"total": total, "fit": fit, "imports": imports, "hydra": hydra, "loads": loads,
            "job": job}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=16, help="seeds in the sweep (K)")
    p.add_argument("--repeats", type=int, default=3, help="runs of dpbench --help and of the floor")
    p.add_argument("--profile", action="store_true", help="profile the sweep in CPU time")
    p.add_argument("--scripts", action="store_true",
                   help="only the other console scripts' --help, wall and CPU")
    args = p.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        if args.scripts:
            scripts = {name: help_seconds(cwd, args.repeats, name) for name in SCRIPTS}
        elif args.profile:
            shares = profile_shares(cwd, args.seeds)
        else:
            help_s, help_cpu = help_seconds(cwd, args.repeats)
            floor_wall, floor_cpu = floor_seconds(cwd, args.repeats)
            first = first_step_seconds(cwd)
            sweep = sweep_share(cwd, args.seeds)
    load_after = os.getloadavg()[0]
    print(f"measured {datetime.now():%Y-%m-%d %H:%M}, {os.cpu_count()} CPUs, load average "
          f"(1 min) {load_before:.2f} before, {load_after:.2f} after")
    print("| figure | value |\n|---|---|")
    if args.scripts:
        for name, (wall, cpu) in scripts.items():
            print(f"| `{name} --help`, wall / CPU (median of {args.repeats}) | {wall:.2f} s / "
                  f"{cpu:.2f} s |")
        return
    if args.profile:
        total = shares["total"]
        print(f"| {args.seeds}-seed sweep, seconds under cProfile | {total:.1f} s |")
        for key, label in (("fit", "training (`Trainer.fit`)"), ("imports", "imports"),
                           ("hydra", f"Hydra's compositions ({shares['loads']:.0f})")):
            print(f"| {label} | {shares[key]:.1f} s, {100 * shares[key] / total:.0f} % |")
        print(f"| `run_job` outside `Trainer.fit`, per job (the first job's imports in it) | "
              f"{(shares['job'] - shares['fit']) / args.seeds:.2f} s |")
        return
    print(f"| `dpbench --help`, wall / CPU (median of {args.repeats}) | {help_s:.2f} s / "
          f"{help_cpu:.2f} s |")
    print(f"| the demo: command start to first training step | {first:.2f} s |")
    print(f"| the floor: a fresh Python importing the libraries the demo imports before its "
          f"first step, wall / CPU (median of {args.repeats}) | {floor_wall:.2f} s / "
          f"{floor_cpu:.2f} s |")
    k = args.seeds
    print(f"| {k}-seed sweep of the demo: wall / CPU | {sweep['wall']:.1f} s / "
          f"{sweep['cpu']:.1f} s |")
    print(f"| {k}-seed sweep: share training (`Trainer.fit`), of wall / of CPU | "
          f"{100 * sweep['train_wall'] / sweep['wall']:.0f} % / "
          f"{100 * sweep['train_cpu'] / sweep['cpu']:.0f} % |")
    print(f"| a job after the first: set-up before its first step, wall / CPU (median) | "
          f"{sweep['setup_wall']:.2f} s / {sweep['setup_cpu']:.2f} s |")
    print(f"| a job after the first: its training, wall / CPU (median) | "
          f"{sweep['run_wall']:.2f} s / {sweep['run_cpu']:.2f} s |")


if __name__ == "__main__":
    main()
