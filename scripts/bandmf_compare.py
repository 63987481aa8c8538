"""BandMF vs DP-SGD (with and without momentum) vs DP-AdamW on a preset: tuned lr, seeds, overhead.

Protocol (the one ``dpbench.hpo`` uses): every (method, epsilon, lr, seed) run trains on the
full training set; a fixed half of the test set (``validation``) picks each (method, epsilon)'s
learning rate by the mean over seeds, and the other half (``test``) reports the picked runs,
so the reported accuracy is not selection-biased. BandMF's b is chosen per epsilon before
training from (N, B, T, epsilon) alone (``expected_error_table``: no data, no privacy cost).
The lr search itself is not accounted (as in the papers compared; the same for every method).
The per-step overhead of BandMF over DP-SGD is measured in one process on the same batches.

    python scripts/bandmf_compare.py --out outputs/bandmf [--eps 1 2 4 8 --seeds 0 1 2]
    python scripts/bandmf_compare.py --out outputs/bandmf --summarise   # the markdown table
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from dpbench.hpo import run_trial
from dpbench.privacy import default_delta
from dpbench.privacy.banded_mf import expected_error_table

#: method label -> (overrides, learning-rate grid)
METHODS = {
    "bandmf": (["method=bandmf"], [0.1, 0.2, 0.4]),
    "dpsgd": (["method=dpsgd"], [1.0, 2.0, 4.0]),
    "dpadamw": (["method=dpadamw"], [0.002, 0.005, 0.01]),
    # control: DP-SGD with BandMF's momentum (= bandmf with b = 1), run last
    "dpsgd_momentum": (["method=dpsgd", "method.optimizer.momentum=0.9"], [0.1, 0.2, 0.4]),
}
QUIET = ["logger=none", "trainer.progress=false", "trainer.checkpoint=false"]


def overhead(preset: list[str], bands: int, steps: int = 5, reps: int = 5) -> dict:
    """Return median seconds per step of bandmf and dpsgd on the same batches, interleaved."""
    from hydra import compose, initialize_config_dir

    from dpbench.cli import CONF_DIR
    from dpbench.experiment import build_trainer

    trainers = {}
    for name, extra in (("dpsgd", ["method=dpsgd"]),
                        ("bandmf", ["method=bandmf", f"method.settings.bands={bands}"])):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("config", overrides=[*preset, *QUIET, *extra])
        trainers[name] = build_trainer(cfg, None)
    loader = iter(trainers["dpsgd"].train_loader)
    batches = [next(loader) for _ in range(steps + 2)]
    for tr in trainers.values():
        for b in batches[:2]:
            tr.train_step(b)
    wall: dict[str, list[float]] = {m: [] for m in trainers}
    for rep in range(reps):
        for m in (list(trainers) if rep % 2 == 0 else list(trainers)[::-1]):
            start = time.perf_counter()
            for b in batches[2:]:
                trainers[m].train_step(b)
            wall[m].append((time.perf_counter() - start) / steps)
    med = {m: statistics.median(v) for m, v in wall.items()}
    return {"bands": bands, "s_per_step": med, "ratio_bandmf_over_dpsgd":
            med["bandmf"] / med["dpsgd"], "raw": wall}


def summarise(out: Path) -> str:
    """Return the markdown table: per (method, epsilon) the lr picked on validation, test acc."""
    rows = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    unique = {(r["method"], r["eps"], r["lr"], r["seed"]): r for r in reversed(rows)}
    rows = list(unique.values())  # workers sharing a folder may repeat a run: keep the first
    by: dict[tuple, dict[float, list[dict]]] = {}
    for r in rows:
        by.setdefault((r["method"], r["eps"]), {}).setdefault(r["lr"], []).append(r)
    eps_all = sorted({r["eps"] for r in rows})
    lines = ["| method | " + " | ".join(f"eps {e:g}" for e in eps_all) + " |",
             "|---|" + "---|" * len(eps_all)]
    for method in [m for m in METHODS if any(k[0] == m for k in by)]:
        cells = []
        for eps in eps_all:
            grid = by.get((method, eps))
            if not grid:
                cells.append("-")
                continue

            def val(runs: list[dict]) -> float:
                ok = [r["validation"]["accuracy"] for r in runs if "validation" in r]
                return statistics.fmean(ok) if len(ok) == len(runs) else -1.0

            lr = max(grid, key=lambda k: val(grid[k]))
            test = [100 * r["test"]["accuracy"] for r in grid[lr] if "test" in r]
            std = statistics.stdev(test) if len(test) > 1 else 0.0
            b = grid[lr][0].get("bands", 1)
            cells.append(f"{statistics.fmean(test):.1f} +- {std:.1f} (lr {lr:g}"
                         + (f", b {b}" if method == "bandmf" else "") + f", n={len(test)})")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    overhead_file = out / "overhead.json"
    if overhead_file.is_file():
        o = json.loads(overhead_file.read_text())
        lines += ["", f"Per-step time, one process, same batches, interleaved (b = {o['bands']}):"
                  f" bandmf / dpsgd = {o['ratio_bandmf_over_dpsgd']:.2f}x "
                  f"({o['s_per_step']['bandmf']:.3f} s vs {o['s_per_step']['dpsgd']:.3f} s)."]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="fiber_mnist_cpu")
    p.add_argument("--eps", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--methods", nargs="+", default=list(METHODS))
    p.add_argument("--n", type=int, default=8000, help="training examples of the preset")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=62)
    p.add_argument("--bands", type=int, nargs="+", default=None,
                   help="b per --eps value (default: chosen by expected_error_table)")
    p.add_argument("--out", type=Path, default=Path("outputs/bandmf"))
    p.add_argument("--grid", type=float, nargs="+", default=None,
                   help="learning rates to run instead of each chosen method's grid")
    p.add_argument("--summarise", action="store_true", help="only print the table")
    args = p.parse_args()
    if args.summarise:
        print(summarise(args.out))
        return
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    preset = [f"experiment={args.preset}"]
    if args.bands:
        table, bands = [], dict(zip(args.eps, args.bands, strict=True))
    else:
        table = expected_error_table(args.n, args.batch, args.steps, args.eps,
                                     [1, 2, 4, 8, 16, 32], default_delta(args.n))
        bands = {eps: min((r for r in table if r["epsilon"] == eps),
                          key=lambda r: r["optimal"])["bands"] for eps in args.eps}
    (args.out / "bands.json").write_text(json.dumps({"chosen": bands, "table": table}, indent=1))
    if not (args.out / "overhead.json").is_file():  # measured once per output folder
        (args.out / "overhead.json").write_text(json.dumps(
            overhead(preset, bands[args.eps[0]]), indent=1))
    runs = args.out / "runs.jsonl"
    done = set()
    if runs.exists():
        done = {(r["method"], r["eps"], r["lr"], r["seed"])
                for r in map(json.loads, runs.read_text().splitlines())}
    for method in args.methods:  # method-major: a cut-short run still has whole rows
        for eps in args.eps:
            extra, grid = METHODS[method]
            grid = args.grid or grid
            if method == "bandmf":
                extra = [*extra, f"method.settings.bands={bands[eps]}"]
            for lr in grid:
                for seed in args.seeds:
                    if (method, eps, lr, seed) in done:
                        continue
                    overrides = [*preset, *QUIET, *extra, f"privacy.target_epsilon={eps}",
                                 f"method.optimizer.lr={lr}", f"seed={seed}"]
                    start = time.perf_counter()
                    try:
                        rec = run_trial(overrides, None)
                        row = {"validation": rec["validation"], "test": rec["test"],
                               "epsilon": rec["epsilon"]}
                    except Exception as err:  # a diverged run is a result, not a crash
                        row = {"failed": f"{type(err).__name__}: {err}"}
                    row.update(method=method, eps=eps, lr=lr, seed=seed,
                               bands=bands[eps] if method == "bandmf" else 1,
                               seconds=time.perf_counter() - start)
                    with runs.open("a") as f:
                        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
