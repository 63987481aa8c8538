"""Wall-clock per DP step of FIBER, DiSK and BandMF relative to DP-AdamW, in one process.

Also BandMF relative to DP-SGD (``bandmf/dpsgd``): the overhead of its correlated noise over
the plain step. All methods train the same model on the same pre-drawn Poisson batches. After
a warm-up (which also gives the two-point methods a non-zero displacement d, so they take both
evaluations), repetitions are interleaved with a rotating method order, so drifts in machine
load hit every method alike. Reports the median seconds per step and the ratios, in
wall-clock and in process CPU time.

    python scripts/bench_fiber_step.py [--steps 5 --reps 7 --preset fiber_mnist_cpu] \
        [--out outputs/fiber/bench.json] [hydra overrides, e.g. trainer.batch_size=512]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from dpbench.config.compose import compose_config
from dpbench.experiment import build_trainer

METHODS = ("dpadamw", "disk", "fiber", "bandmf", "dpsgd")
#: extra ratios besides every method against DP-AdamW
PAIRS = (("bandmf", "dpsgd"),)
DEFAULTS = ["logger=none", "trainer.progress=false", "trainer.checkpoint=false"]


def _trainer(method: str, overrides: list[str]):
    cfg = compose_config([*overrides, *DEFAULTS, f"method={method}"])
    return build_trainer(cfg, None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="steps per timed block")
    parser.add_argument("--reps", type=int, default=7, help="interleaved repetitions")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per method")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out", default="outputs/fiber/bench.json")
    parser.add_argument("--preset", default="fiber_mnist_cpu", help="experiment preset")
    args, overrides = parser.parse_known_args()
    overrides = [f"experiment={args.preset}", *overrides]
    torch.set_num_threads(args.threads)
    trainers = {m: _trainer(m, overrides) for m in METHODS}
    first = trainers[METHODS[0]]
    loader = iter(first.train_loader)
    batches = [next(loader) for _ in range(args.warmup + args.steps)]
    for tr in trainers.values():
        for batch in batches[:args.warmup]:
            tr.train_step(batch)
    timed = batches[args.warmup:]
    wall: dict[str, list[float]] = {m: [] for m in METHODS}
    cpu: dict[str, list[float]] = {m: [] for m in METHODS}
    for rep in range(args.reps):
        order = METHODS[rep % len(METHODS):] + METHODS[:rep % len(METHODS)]
        for m in order:
            w0, c0 = time.perf_counter(), time.process_time()
            for batch in timed:
                trainers[m].train_step(batch)
            wall[m].append((time.perf_counter() - w0) / len(timed))
            cpu[m].append((time.process_time() - c0) / len(timed))
    med = {m: {"wall_s_per_step": statistics.median(wall[m]),
               "cpu_s_per_step": statistics.median(cpu[m]),
               "gradient_evaluations_per_step":
                   trainers[m].method.gradient_evaluations_per_step()} for m in METHODS}
    pairs = [*((m, "dpadamw") for m in METHODS if m != "dpadamw"), *PAIRS]
    ratios = {f"{m}/{ref}": {k: med[m][f"{k}_s_per_step"] / med[ref][f"{k}_s_per_step"]
                             for k in ("wall", "cpu")} for m, ref in pairs}
    result = {"config": [*DEFAULTS, *overrides], "steps": args.steps, "reps": args.reps,
              "warmup": args.warmup, "threads": args.threads,
              "batch_size_expected": first.plan.expected_batch_size,
              "per_method": med, "ratios": ratios, "raw_wall": wall, "raw_cpu": cpu}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    for name, r in ratios.items():
        print(f"{name}: wall {r['wall']:.2f}x, cpu {r['cpu']:.2f}x")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
