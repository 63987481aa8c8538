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

from omegaconf import DictConfig, OmegaConf

from dpbench.config.compose import compose_config
from dpbench.errors import ConfigError, DPBenchError
from dpbench.tune.choices import (
    CHOICES_NAME,
    MODES,
    apply_tuned,
    cfg_cell_key,
    choice_mode,
    read_choices,
    write_choice,
)
from dpbench.tune.search import TuneSettings, check_cell, check_settings, expand_cells, search_cell
from dpbench.utils.io import make_dirs, remove_created

log = logging.getLogger("dpbench.tune")
_QUIET = ["logger=none", "trainer.progress=false", "trainer.checkpoint=false"]


def check_cell_config(cfg: DictConfig) -> None:
    """Run the checks a run makes before training, without loading data (ConfigError)."""
    from dpbench.config.schema import (
        PrivacyConfig,
        TrainerConfig,
        check_method_numbers,
        check_privacy_matches_method,
    )
    from dpbench.config.targets import check_targets
    from dpbench.data import DATASETS
    from dpbench.methods import get_method
    from dpbench.models import MODELS
    from dpbench.utils.paths import check_path_values

    def typed(cls, group: str):
        node = OmegaConf.to_container(cfg[group], resolve=True)
        try:
            return cls(**node)
        except TypeError as err:
            raise ConfigError(f"{group}: {err}") from err

    check_path_values(cfg)
    privacy = typed(PrivacyConfig, "privacy")
    typed(TrainerConfig, "trainer")
    method = get_method(cfg.method.name)
    check_privacy_matches_method(cfg.method.name, method.private, privacy)
    optimizer = cfg.method.get("optimizer")
    if not optimizer or not optimizer.get("_target_"):
        raise ConfigError("method.optimizer must name an optimiser (method.optimizer._target_)")
    check_targets(optimizer, "method.optimizer")
    method_settings = cfg.method.get("settings")
    check_method_numbers(OmegaConf.to_container(optimizer, resolve=True),
                         OmegaConf.to_container(method_settings, resolve=True)
                         if method_settings else {})

    def group_settings(group: str, *drop: str) -> dict:
        node = OmegaConf.to_container(cfg[group], resolve=True)
        return {k: v for k, v in node.items() if k not in drop}

    DATASETS.check_settings(cfg.dataset.name, group_settings("dataset", "name", "task"))
    MODELS.check_settings(cfg.model.name, group_settings("model", "name"))


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


def _number_list(text: str, kind: type, what: str) -> list:
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be comma-separated "
                                         f"{'integers' if kind is int else 'numbers'} "
                                         f"(got {text!r})") from None


def _floats(text: str) -> list[float]:
    return _number_list(text, float, "--lrs")


def _ints(text: str) -> list[int]:
    return _number_list(text, int, "--seeds")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse adds the usage block)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def settings_of(args: argparse.Namespace) -> TuneSettings:
    return TuneSettings(lrs=args.lrs, mode=args.mode, select=args.select,
                        validation_fraction=args.validation_fraction,
                        selection_epsilon=args.selection_epsilon, master_seed=args.master_seed)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = _Parser(prog="dpbench-tune", description=__doc__.splitlines()[0])
    p.add_argument("--lrs", type=_floats, default=[0.01, 0.03, 0.1, 0.3, 1.0],
                   help="learning-rate grid, comma-separated (default 0.01,...,1)")
    p.add_argument("--seeds", type=_ints, default=[0, 1, 2, 3, 4],
                   help="seeds of the final runs, comma-separated (default 0-4)")
    p.add_argument("--mode", choices=MODES, default="accounted",
                   help="accounted: the search's epsilon is reported; unaccounted: it is not")
    p.add_argument("--select", default="accuracy", help="validation metric to maximise")
    p.add_argument("--validation-fraction", type=float, default=0.15)
    p.add_argument("--selection-epsilon", type=float, default=None,
                   help="accounted mode: epsilon of the choice, a finite number > 0 (default: "
                        "the cell's target epsilon)")
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
    if not args.seeds:
        p.error("--seeds needs at least one seed")
    if any(not 0 <= seed < 2**63 for seed in args.seeds):
        p.error(f"--seeds must be integers >= 0 and < 2**63 (got {args.seeds})")
    if args.master_seed < 0:
        p.error(f"--master-seed must be an integer >= 0 (got {args.master_seed})")
    if args.jobs < 1:
        p.error("--jobs must be at least 1")
    try:
        check_settings(settings_of(args))
    except ConfigError as err:
        p.error(str(err))
    return args


def check_cells(args: argparse.Namespace) -> list[list[str]]:
    """Return the cells of the sweep after checking each one's config and any stored choice,
    before any work (ConfigError); cells that share a key are refused (one would overwrite
    the other's choice and runs)."""
    cells = expand_cells(args.overrides)
    settings = settings_of(args)
    choices = args.out / CHOICES_NAME
    known = read_choices(choices) if choices.exists() or choices.is_symlink() else {}
    keys: dict[str, list[str]] = {}
    for cell in cells:
        cfg = compose_config([*_QUIET, *cell])
        check_cell_config(cfg)
        check_cell(cfg, settings)
        key = cfg_cell_key(cfg)
        if key in keys:
            raise ConfigError(f"the cells {' '.join(keys[key])} and {' '.join(cell)} are the "
                              f"same run ({key}); drop one")
        keys[key] = cell
        if not args.research:
            choice_mode(choices, known, key)  # a stored choice that will be reused is checked
    return cells


def run(args: argparse.Namespace) -> Path:
    """Search every cell (or reuse its choice), train the choices on every seed; return OUT."""
    out = args.out
    cells = check_cells(args)
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
    from dpbench.utils.paths import path_component

    out = args.out
    choices = out / CHOICES_NAME
    settings = settings_of(args)
    cell_cfg = compose_config([*_QUIET, *cell])
    key = cfg_cell_key(cell_cfg)
    known = read_choices(choices) if choices.exists() else {}
    if args.research or choice_mode(choices, known, key) != args.mode:
        if args.mode == "accounted":
            from dpbench.tune.search import selection_epsilon

            log.info("%s: selection epsilon %g (%s)", key, selection_epsilon(settings, cell_cfg),
                     "--selection-epsilon" if args.selection_epsilon is not None
                     else "the cell's target epsilon")
        choice = search_cell(cell, settings, train)
        write_choice(choices, key, choice)
        log.info("%s: chose %s", key, choice["overrides"])
    digest = key.rpartition("=")[2]  # cells that differ only outside run_name get own folders
    for seed in args.seeds:
        cfg = compose_config([*_QUIET, *cell, f"seed={seed}"])
        run_dir = out / "runs" / path_component(f"{cfg.run_name}-{digest}")
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


def _fail(message: str) -> int:
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    print(f"dpbench-tune: error: {' / '.join(lines)}", file=sys.stderr)
    return 2


def _prepare_out(out: Path) -> list[Path]:
    """Create ``out`` (and missing parents); return the folders created, top first. OSError
    if it cannot be created or written (the folders created are removed again)."""
    import tempfile

    created = make_dirs(out)
    try:
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError:
        remove_created(created)
        raise
    return created


def main(argv: list[str] | None = None) -> int:
    from dpbench.utils.lock import RunDirBusy, RunDirLock

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[dpbench-tune] %(message)s")
    try:
        check_cells(args)  # every cell and stored choice, before anything is created
    except DPBenchError as err:
        return _fail(str(err))
    try:
        created = _prepare_out(args.out)
    except OSError as err:
        return _fail(f"cannot write into --out {args.out}: {err.strerror or err}")
    lock = RunDirLock(args.out)  # one dpbench-tune per --out: the report must match the files
    try:
        lock.acquire()
    except (RunDirBusy, OSError) as err:
        remove_created(created)
        holder = str(err).partition("(pid ")[2].partition(")")[0] or "?"
        return _fail(f"--out {args.out} is in use by another dpbench-tune (pid {holder}); wait "
                     "for it or choose another --out" if isinstance(err, RunDirBusy)
                     else f"cannot lock --out {args.out}: {err}")
    try:
        out = run(args)
        text = report(out, args.metric, args.baseline)
    except DPBenchError as err:
        return _fail(str(err))
    except OSError as err:
        return _fail(f"{err.filename or args.out}: {err.strerror or err}")
    finally:
        lock.release()
        remove_created(created)  # only if nothing was written
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
