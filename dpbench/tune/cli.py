"""``dpbench-tune``: tune each cell of a sweep on a validation split, then train the choice on
every seed and report mean, 95 % CI and a verdict against a baseline (docs/tuning-and-claims.md).

    dpbench-tune --mode accounted --lrs 0.01,0.03,0.1,0.3,1 --seeds 0,1,2,3,4 \\
        --baseline dpsgd --out outputs/tune/digits -- method=dpsgd,dpadam privacy=eps1,eps3

Writes ``OUT/choices.json`` (reused later by ``dpbench ... tuned=OUT/choices.json``), one
``OUT/runs/<run name>/results.json`` per final run and ``OUT/report.md``. A cell whose choice
is already in ``choices.json`` is not searched again (``--research`` forces a new search).
``--jobs k`` searches and trains k cells at a time, each in its own process with
``max(1, cores // k)`` torch threads.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from dpbench.errors import DPBenchError
from dpbench.tune.choices import CHOICES_NAME, MODES, apply_tuned, read_choices, write_choice
from dpbench.tune.search import TuneSettings, expand_cells, search_cell

log = logging.getLogger("dpbench.tune")
_QUIET = ["logger=none", "trainer.progress=false", "trainer.checkpoint=false"]


def compose_config(overrides: list[str]) -> DictConfig:
    """Return the composed run config of ``overrides`` (the CLI's config tree)."""
    from hydra import compose, initialize_config_dir

    from dpbench.cli import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=overrides)


def train(overrides: list[str], run_dir: Path | None = None) -> tuple[DictConfig, dict[str, Any]]:
    """Train one configuration in this process; write its results.json into ``run_dir``."""
    from dpbench.experiment import build_trainer
    from dpbench.logging.records import write_record
    from dpbench.logging.results import run_record

    cfg = apply_tuned(compose_config([*_QUIET, *overrides]))
    trainer = build_trainer(cfg, run_dir)
    summary = trainer.fit()
    summary["evaluated_examples"] = len(trainer.data.test)
    if run_dir is not None:
        record = run_record(cfg, {k: v for k, v in summary.items()
                                  if k != "evaluated_examples"}, "completed")
        write_record(run_dir, record)
    return cfg, summary


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v]


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dpbench-tune", description=__doc__.splitlines()[0])
    p.add_argument("--lrs", type=_floats, default=[0.01, 0.03, 0.1, 0.3, 1.0],
                   help="learning-rate grid, comma-separated (default 0.01,...,1)")
    p.add_argument("--seeds", type=_ints, default=[0, 1, 2, 3, 4],
                   help="seeds of the final runs, comma-separated (default 0-4)")
    p.add_argument("--mode", choices=MODES, default="accounted",
                   help="accounted: the search's epsilon is reported; unaccounted: it is not")
    p.add_argument("--select", default="accuracy", help="validation metric to maximise")
    p.add_argument("--validation-fraction", type=float, default=0.15)
    p.add_argument("--selection-epsilon", type=float, default=None,
                   help="accounted mode: epsilon of the choice (default: the cell's target)")
    p.add_argument("--master-seed", type=int, default=0,
                   help="seed from which every trial's and the selection's seeds are spawned")
    p.add_argument("--baseline", default=None, help="method to compare with (verdict column)")
    p.add_argument("--metric", default="accuracy", help="test metric of the report")
    p.add_argument("--research", action="store_true", help="search again cells already chosen")
    p.add_argument("--out", type=Path, default=Path("outputs/tune"))
    p.add_argument("--jobs", type=int, default=1,
                   help="cells at a time, one process each (default 1: in this process)")
    p.add_argument("overrides", nargs="*", help="sweep overrides, e.g. method=dpsgd,dpadam")
    args = p.parse_args(argv)
    if not args.lrs:
        p.error("--lrs needs at least one learning rate")
    if not 0.0 < args.validation_fraction < 1.0:
        p.error("--validation-fraction must be in (0, 1)")
    if args.jobs < 1:
        p.error("--jobs must be at least 1")
    return args


def run(args: argparse.Namespace) -> Path:
    """Search every cell (or reuse its choice), train the choices on every seed; return OUT."""
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    cells = expand_cells(args.overrides)
    jobs = min(args.jobs, len(cells))
    if jobs <= 1:
        for cell in cells:
            run_cell(cell, args)
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from dpbench.utils.threads import available_cores, threads_per_job

    # the sweeps' rule: cores // jobs threads each, unless OMP_NUM_THREADS says otherwise
    threads = threads_per_job(None, jobs, available_cores())
    # spawn, not fork: a forked child would inherit this process's torch thread pools
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_init_worker, initargs=(threads,)) as pool:
        for done in [pool.submit(run_cell, cell, args) for cell in cells]:
            done.result()  # re-raise a worker's error here
    return out


def _init_worker(threads: int | None) -> None:
    """Set up one --jobs worker: its share of the cores (None: torch's default)."""
    logging.basicConfig(level=logging.INFO, format="[dpbench-tune] %(message)s")
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def run_cell(cell: list[str], args: argparse.Namespace) -> None:
    """Search one cell (unless its choice is stored) and train the choice on every seed."""
    from dpbench.tune.choices import cfg_cell_key

    out = args.out
    choices = out / CHOICES_NAME
    settings = TuneSettings(lrs=args.lrs, mode=args.mode, select=args.select,
                            validation_fraction=args.validation_fraction,
                            selection_epsilon=args.selection_epsilon,
                            master_seed=args.master_seed)
    key = cfg_cell_key(compose_config([*_QUIET, *cell]))
    known = read_choices(choices) if choices.exists() else {}
    if args.research or key not in known or known[key]["mode"] != args.mode:
        choice = search_cell(cell, settings, train)
        write_choice(choices, key, choice)
        log.info("%s: chose %s", key, choice["overrides"])
    for seed in args.seeds:
        cfg = compose_config([*_QUIET, *cell, f"seed={seed}"])
        run_dir = out / "runs" / str(cfg.run_name)
        train([*cell, f"tuned={choices}", f"seed={seed}"], run_dir)


def report(out: Path, metric: str, baseline: str | None) -> str:
    """Write and return ``OUT/report.md``: cells with CIs, tuned lr, verdicts vs baseline."""
    from dpbench.analysis.results import load_frame
    from dpbench.analysis.tables import baseline_table, cell_table, markdown_table

    frame = load_frame(out / "runs")
    text = f"# {metric}: mean ± 95 % t-interval over seeds\n\n"
    text += markdown_table(cell_table(frame, metric)) + "\n"
    lrs = frame[frame["status"] == "completed"].groupby(
        ["label", "dataset", "model", "tuning", "target_epsilon"], dropna=False)[
        ["tuned_lr", "lr_at_grid_edge"]].first()
    text += "\n## Tuned learning rates\n\n" + markdown_table(lrs.reset_index()) + "\n"
    if "total_epsilon" in frame and frame["total_epsilon"].notna().any():
        tot = frame.groupby(["label", "target_epsilon"], dropna=False)["total_epsilon"].max()
        text += ("\n## Total epsilon (search + run, accounted mode)\n\n"
                 + markdown_table(tot.reset_index()) + "\n")
    if baseline:
        text += (f"\n## Against {baseline} (paired by seed, 95 % CI)\n\n"
                 + markdown_table(baseline_table(frame, metric, baseline)
                                  .drop(columns=["ci_low", "ci_high"], errors="ignore")) + "\n")
    (out / "report.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[dpbench-tune] %(message)s")
    try:
        out = run(args)
    except DPBenchError as err:
        print(f"dpbench-tune: error: {err}", file=sys.stderr)
        return 2
    print(report(out, args.metric, args.baseline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
