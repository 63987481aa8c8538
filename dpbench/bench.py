"""``dpbench-bench``: the cost of privacy per step, as ratios measured in one process.

For each model: the median time of one DP-SGD step (per-example work, clipping, noise,
update) in each dpbench grad-sample mode (``bk``, ``hooks``, ``ghost``, ...) and in raw
Opacus (``PrivacyEngine.make_private`` with hooks and with ghost clipping, Opacus's own loss
and optimiser), divided by the median time of one non-private step (mean-loss backward,
update) on the same batch. Warm-up first, then repetitions that rotate the order of all
variants, so drift (thermal, other load) hits each alike. The load average is printed: on a
shared machine, compare ratios from one run only.

Method rows (``METHOD_MODELS``) time whole loop steps of several methods (release, the
method's noise and post-processing, update; the methods' own optimisers) on one preset's
model and batch in each engine mode, against the first method's book-keeping step.
``--models fiber_cpu``: DP-AdamW, DiSK and FIBER on ``fiber_cifar10_cpu``'s, the cost of
the second evaluation point; ``--models bandmf_cpu``: DP-SGD and BandMF on
``fiber_mnist_cpu``'s, the cost of the correlated noise. ``--models vit_small`` is the ViT
preset's model at a CPU resolution.

The steps and the clock (torch, Opacus, the methods) live in ``dpbench.bench_steps``, imported
only once the command line is parsed: ``dpbench-bench --help`` starts in well under a second.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import TYPE_CHECKING

from dpbench.bench_presets import (
    DEFAULT_MODELS,
    DPBENCH_MODES,
    EXTRA_MODELS,
    METHOD_MODELS,
    OPACUS_MODES,
    TEXT_MODELS,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch


def _ratio(values: list[float]) -> str:
    """Return "median x (min-max)" of per-round ratios ("1.36x (1.30-1.41)"; one round: "1.36x")."""
    mid = statistics.median(values)
    if len(values) == 1:
        return f"{mid:.2f}x"
    return f"{mid:.2f}x ({min(values):.2f}-{max(values):.2f})"


def summarise_rounds(rounds: list[dict[str, float]]) -> dict[str, tuple[float, str, str]]:
    """Return {variant: (median seconds, ratio to non-private, ratio to best Opacus)}.

    Each round is one ``bench_model`` result (fresh models, interleaved repetitions); ratios
    are formed within a round, then their median and range over rounds are reported, so a
    round's drift or allocation luck does not decide a comparison. "Best Opacus" is the
    faster raw Opacus mode of each round. A variant that failed in any round is "failed".
    """
    out: dict[str, tuple[float, str, str]] = {}
    for key in rounds[0]:
        times = [r[key] for r in rounds]
        if any(t != t for t in times):
            out[key] = (float("nan"), "failed", "-")
            continue
        vs_base = _ratio([r[key] / r["nonprivate"] for r in rounds])
        best = [min((v for k, v in r.items() if k.startswith("opacus") and v == v),
                    default=float("nan")) for r in rounds]
        vs_best = (_ratio([r[key] / b for r, b in zip(rounds, best)])
                   if key.startswith("dpbench") and all(b == b for b in best) else "-")
        out[key] = (statistics.median(times), vs_base, vs_best)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dpbench-bench",
        description="Median DP-SGD step time / non-private step time per model, for dpbench's "
                    "grad-sample modes and raw Opacus make_private, measured in one process "
                    "(warm-up, interleaved repetitions).")
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS),
                        choices=[*DEFAULT_MODELS, *TEXT_MODELS, *EXTRA_MODELS, *METHOD_MODELS],
                        help=f"{', '.join(METHOD_MODELS)}: the methods of a preset on its "
                             "model, each against DP-AdamW's step in the same engine mode")
    parser.add_argument("--modes", nargs="+", default=list(DPBENCH_MODES),
                        choices=list(DPBENCH_MODES), help="dpbench grad-sample modes")
    parser.add_argument("--opacus-modes", nargs="*", default=list(OPACUS_MODES),
                        choices=list(OPACUS_MODES), help="raw Opacus reference rows")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="override the per-model default batch size")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3,
                        help="independent rounds (fresh models, interleaved repetitions): "
                             "the ratios are the median over rounds, with their range")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--processes", type=int, default=None,
                        help="also time the bk step split over K processes (gloo/NCCL, "
                             "bench_processes.py) against 1 process, per model")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: this thread's CPU time (needs --threads 1 on CPU); on a "
                             "loaded machine it is not inflated by waiting for a core")
    parser.add_argument("--seeds", type=int, default=None,
                        help="instead of the step tables: seeds per CPU-minute of an N-seed "
                             "sweep of the demo cell, each seed alone vs --seeds-at-once at "
                             "a time (fresh dpbench processes; bench_seeds.py)")
    parser.add_argument("--users", type=int, default=None,
                        help="time per-user clipping instead (privacy.unit=user, ULS): the "
                             "batch's rows as users of this many rows, each mode against "
                             "hooks per user (bench_users.py)")
    parser.add_argument("--seeds-at-once", type=int, default=16)
    parser.add_argument("--seed-rounds", type=int, default=1,
                        help="rounds of the two sweeps, alternating their order")
    parser.add_argument("--mia-references", type=int, default=None,
                        help="(with or without --seeds) models per CPU-minute of a dpbench-mia "
                             "cell of the demo with this many reference models, each model "
                             "alone vs all at once (fresh processes; bench_seeds.py)")
    args = parser.parse_args(argv)
    for option, value, least in (("--rounds", args.rounds, 1), ("--reps", args.reps, 1),
                                 ("--warmup", args.warmup, 0), ("--threads", args.threads, 1),
                                 ("--batch-size", args.batch_size, 1),
                                 ("--processes", args.processes, 2),
                                 ("--users", args.users, 1)):
        if value is not None and value < least:
            parser.error(f"{option} must be at least {least} (got {value})")
    for option, value in (("--seeds", args.seeds), ("--seeds-at-once", args.seeds_at_once),
                          ("--seed-rounds", args.seed_rounds),
                          ("--mia-references", args.mia_references)):
        if value is not None and value < 1:
            parser.error(f"{option} must be at least 1 (got {value})")
    if args.seeds or args.mia_references:
        from dpbench.bench_seeds import bench_mia, bench_seeds, print_seeds_table

        load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
        print(f"{time.strftime('%Y-%m-%d %H:%M')}, load average {load[0]:.1f} "
              f"(cpus {os.cpu_count()}), OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
        if args.seeds:
            print_seeds_table(args.seeds, args.seeds_at_once,
                              bench_seeds(args.seeds, args.seeds_at_once, args.seed_rounds))
        if args.mia_references:
            models = args.mia_references + 1
            print_seeds_table(models, models, bench_mia(args.mia_references, args.seed_rounds),
                              cell=f"dpbench-mia demo, 1 target + {args.mia_references} "
                                   "references", unit="models")
        return 0
    import torch  # only now: --help and bad arguments stop before torch is imported

    from dpbench import bench_steps as steps

    if args.device not in ("auto", "cpu") and not args.device.startswith("cuda"):
        parser.error(f"--device must be auto, cpu or cuda[:N] (got {args.device!r})")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device is available")
    if args.clock == "cpu" and (args.threads != 1 or args.device == "cuda"):
        parser.error("--clock cpu measures one thread: use it with --threads 1 on CPU")
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else ("cpu" if args.device == "auto" else args.device))
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"clock {args.clock}, load average {load[0]:.1f} (cpus {os.cpu_count()})")
    if args.users:
        _print_users(args, device, clock)
        return 0
    if any(name not in METHOD_MODELS for name in args.models):
        print("| model | variant | batch | ms / step | / non-private | / best Opacus |")
        print("|---|---|---|---|---|---|")
    method_rows = []
    for name in args.models:
        if name in METHOD_MODELS:
            _, _, b_cpu, b_gpu, methods = METHOD_MODELS[name]
            batch = args.batch_size or (b_gpu if device.type == "cuda" else b_cpu)
            modes = [m for m in args.modes if m in ("bk", "hooks", "functorch")] or ["bk"]
            rounds = [steps.bench_methods(name, modes, batch, device, args.reps, args.warmup,
                                          clock) for _ in range(args.rounds)]
            method_rows.append((name, batch, methods, modes, rounds))
            continue
        shape, b_cpu, b_gpu = DEFAULT_MODELS.get(name, ((32,), 64, 256))  # text: SST-2's
        if name in EXTRA_MODELS:
            shape, b_cpu, b_gpu = EXTRA_MODELS[name][2:]
        batch = args.batch_size or (b_gpu if device.type == "cuda" else b_cpu)
        heavy = name in ("resnet18", *EXTRA_MODELS) and device.type != "cuda"
        reps = min(args.reps, 6) if heavy else args.reps
        rounds = [steps.bench_model(name, args.modes, args.opacus_modes, batch, shape, device,
                                    reps, args.warmup, clock) for _ in range(args.rounds)]
        for key, (t, vs_base, vs_best) in summarise_rounds(rounds).items():
            if t != t:
                print(f"| {name} | {key} | {batch} | - | failed | - |")
                continue
            print(f"| {name} | {key} | {batch} | {1e3 * t:.1f} | {vs_base} | {vs_best} |",
                  flush=True)
    for name, batch, methods, modes, rounds in method_rows:
        ref = f"{methods[0]} {'bk' if 'bk' in modes else modes[0]}"
        print(f"\n| {name} | method | engine | batch | ms / step | / non-private | / {ref} |")
        print("|---|---|---|---|---|---|---|")
        for method in methods:
            for mode in modes:
                key = f"{method} {mode}"
                t = statistics.median(r[key] for r in rounds)
                vs_base = _ratio([r[key] / r["nonprivate"] for r in rounds])
                vs_ref = _ratio([r[key] / r[ref] for r in rounds])
                print(f"| {name} | {method} | {mode} | {batch} | {1e3 * t:.1f} | {vs_base} | "
                      f"{vs_ref} |", flush=True)
    if args.processes:
        _print_processes(args, device)
    return 0


def _print_users(args: argparse.Namespace, device: torch.device,
                 clock: Callable[[], float]) -> None:
    """Print each mode's per-user step: median ms, and its ratios (median and range over
    rounds) to the non-private step and to the ``hooks`` per-user step."""
    from dpbench import bench_steps as steps
    from dpbench.bench_users import REFERENCE

    ref = f"{REFERENCE} per user"
    print(f"| model | variant | batch | ms / step | / non-private | / {ref} |")
    print("|---|---|---|---|---|---|")
    modes = list(dict.fromkeys([REFERENCE, *args.modes]))
    for name in (m for m in args.models if m in DEFAULT_MODELS):  # the image models
        shape, b_cpu, b_gpu = DEFAULT_MODELS[name]
        batch = args.batch_size or (b_gpu if device.type == "cuda" else b_cpu)
        rounds = [steps.bench_users(name, modes, batch, shape, args.users, device, args.reps,
                              args.warmup, clock) for _ in range(args.rounds)]
        users = -(-batch // args.users)
        for key in rounds[0]:
            if key == "nonprivate" or any(r[key] != r[key] for r in rounds):
                continue
            t = statistics.median(r[key] for r in rounds)
            vs_ref = (_ratio([r[key] / r[ref] for r in rounds])
                      if all(r[ref] == r[ref] for r in rounds) else "-")
            print(f"| {name} | {key} | {batch} ({users} users of {args.users}) | "
                  f"{1e3 * t:.1f} | {_ratio([r[key] / r['nonprivate'] for r in rounds])} | "
                  f"{vs_ref} |", flush=True)


def _print_processes(args: argparse.Namespace, device: torch.device) -> None:
    """Print the K-process bk step next to the 1-process one (rounds alternate the two)."""
    from dpbench import bench_steps as steps
    from dpbench.bench_processes import bench_processes

    k = args.processes
    print(f"\n| model | variant | batch | ms / step (1 process) | ms / step ({k} processes) "
          f"| {k} / 1 |")
    print("|---|---|---|---|---|---|")
    for name in (m for m in args.models if m in DEFAULT_MODELS):  # the image models
        shape, b_cpu, b_gpu = DEFAULT_MODELS[name]
        batch = args.batch_size or (b_gpu if device.type == "cuda" else b_cpu)
        rounds = bench_processes(name, "bk", batch, shape, k, args.reps, args.warmup,
                                 args.rounds, steps.rank_step, device.type, args.threads or 1)
        one = statistics.median(r[0] for r in rounds)
        many = statistics.median(r[1] for r in rounds)
        print(f"| {name} | dpbench bk, {k} processes | {batch} | {1e3 * one:.1f} | "
              f"{1e3 * many:.1f} | {_ratio([r[1] / r[0] for r in rounds])} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
