"""``dpbench-tune``: tune each cell of a sweep on a validation split, then train the choice on
every seed and report mean, 95 % CI and a verdict against a baseline (docs/tuning-and-claims.md).

    dpbench-tune --mode accounted --lrs 0.01,0.03,0.1,0.3,1 --seeds 0,1,2,3,4 \\
        --baseline dpsgd --out outputs/tune/digits -- method=dpsgd,dpadam privacy=eps1,eps3
    dpbench-tune --strategy random --trials 20 --lr-range 0.01,1 --batch-sizes 64,128,256 \\
        --mode unaccounted --out outputs/tune/random -- method=dpsgd privacy=eps3

The grid tries each learning rate of ``--lrs``; the random strategy draws ``--trials``
configurations in advance (``dpbench.tune.search``). ``tune(overrides, **options)`` is the
same command as a Python function (``dpbench-reproduce`` calls it).

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dpbench.config.compose import compose_config
from dpbench.errors import ConfigError, DPBenchError
from dpbench.tune.choices import (
    CHOICES_NAME,
    MAX_TRIALS,
    MODES,
    cfg_cell_key,
    choice_mode,
    read_choices,
    write_choice,
)
from dpbench.tune.search import (
    DEFAULT_LR_RANGE,
    DEFAULT_LRS,
    STRATEGIES,
    TuneSettings,
    check_cell,
    check_settings,
    expand_cells,
    search_cell,
)
from dpbench.utils.io import atomic_write_text, make_dirs, remove_created

log = logging.getLogger("dpbench.tune")
_QUIET = ["logger=none", "trainer.progress=false", "trainer.checkpoint=false"]
DEFAULT_SEEDS = (0, 1, 2, 3, 4)
DEFAULT_OUT = Path("outputs/tune")
#: options of the random strategy only (refused with --strategy grid)
_RANDOM_ONLY = ("trials", "lr_range", "batch_sizes", "clip_floors")


def train(overrides: list[str], run_dir: Path | None = None) -> tuple[DictConfig, dict[str, Any]]:
    """Train one configuration in this process through the shared job wrapper
    (``runners.locked.train_in``: ``build_spec``, ``run(spec)``, with ``run_dir`` its lock and
    record); return the run's config and summary (plus ``evaluated_examples``)."""
    from dpbench.runners.locked import train_in

    trainers: list[Any] = []
    spec, summary = train_in(compose_config([*_QUIET, *overrides]), run_dir,
                             ready=trainers.append)
    return spec.cfg, {**summary, "evaluated_examples": len(trainers[0].data.test)}


def _number_list(text: str, kind: type, what: str) -> list:
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be comma-separated "
                                         f"{'integers' if kind is int else 'numbers'} "
                                         f"(got {text!r})") from None


def _numbers(kind: type, what: str):
    return lambda text: _number_list(text, kind, what)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse adds the usage block)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


@dataclass
class TuneJob:
    """One ``dpbench-tune``: the sweep, how each cell is searched, the final runs, OUT."""

    overrides: list[str]
    settings: TuneSettings
    seeds: list[int] = field(default_factory=lambda: list(DEFAULT_SEEDS))
    out: Path = DEFAULT_OUT
    jobs: int = 1
    research: bool = False


#: most seeds a tuned sweep trains each choice on, and most jobs at a time
MAX_SEEDS, MAX_JOBS = 1000, 256


def check_job(job: TuneJob) -> None:
    """Raise ConfigError naming the option if ``job`` cannot run (before any work)."""
    if not job.seeds:
        raise ConfigError("--seeds needs at least one seed")
    if len(job.seeds) > MAX_SEEDS:
        raise ConfigError(f"--seeds: {len(job.seeds)} seeds, more than the {MAX_SEEDS} allowed")
    if len(job.settings.lrs) > MAX_TRIALS:
        raise ConfigError(f"--lrs: {len(job.settings.lrs)} learning rates, more than the "
                          f"{MAX_TRIALS} a choices file holds")
    if any(isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2**63
           for s in job.seeds):
        raise ConfigError(f"--seeds must be integers >= 0 and < 2**63 (got {job.seeds})")
    master = job.settings.master_seed
    if isinstance(master, bool) or not isinstance(master, int) or master < 0:
        raise ConfigError(f"--master-seed must be an integer >= 0 (got {master})")
    if (isinstance(job.jobs, bool) or not isinstance(job.jobs, int)
            or not 1 <= job.jobs <= MAX_JOBS):
        raise ConfigError(f"--jobs must be an integer in [1, {MAX_JOBS}] (got {job.jobs!r})")
    check_settings(job.settings)


def make_job(overrides: Sequence[str] = (), *, out: str | Path = DEFAULT_OUT,
             seeds: Sequence[int] = DEFAULT_SEEDS, mode: str = "accounted",
             strategy: str = "grid", lrs: Sequence[float] = DEFAULT_LRS, trials: int = 20,
             lr_range: Sequence[float] = DEFAULT_LR_RANGE,
             batch_sizes: Sequence[int] | None = None,
             clip_floors: Sequence[float] | None = None, select: str = "accuracy",
             validation_fraction: float = 0.15, selection_epsilon: float | None = None,
             master_seed: int = 0, jobs: int = 1, research: bool = False) -> TuneJob:
    """Return the checked TuneJob of ``dpbench-tune``'s options (the keywords, with the same
    names and defaults); ConfigError naming the option if one is unusable."""
    settings = TuneSettings(lrs=list(lrs), mode=mode, select=select,
                            validation_fraction=validation_fraction,
                            selection_epsilon=selection_epsilon, master_seed=master_seed,
                            strategy=strategy, trials=trials, lr_range=list(lr_range),
                            batch_sizes=list(batch_sizes) if batch_sizes else None,
                            clip_floors=list(clip_floors) if clip_floors else None)
    job = TuneJob(list(overrides), settings, list(seeds), Path(out), jobs, research)
    check_job(job)
    return job


def tune(overrides: Sequence[str] = (), **options: Any) -> Path:
    """Search every cell of the sweep ``overrides`` (or reuse its stored choice) and train the
    choice on every seed; return OUT. ``dpbench-tune`` as a function: ``options`` are its
    options as keywords (``make_job``), checked before any work (ConfigError). It writes no
    ``report.md`` and takes no lock on OUT (``main`` does both)."""
    job = make_job(overrides, **options)
    return run(job, check_cells(job))


def command_line(overrides: Sequence[str] = (), **options: Any) -> str:
    """Return the ``dpbench-tune`` command line (shell-quoted) that ``tune(overrides,
    **options)`` runs."""
    import shlex

    words = ["dpbench-tune"]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            words += [flag] if value else []
        elif value is not None:
            words += [flag, ",".join(map(str, value)) if isinstance(value, (list, tuple))
                      else str(value)]
    return shlex.join([*words, "--", *overrides])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = _Parser(prog="dpbench-tune", description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--strategy", choices=STRATEGIES, default="grid",
                   help="grid: one trial per learning rate of --lrs; random: --trials "
                        "configurations drawn from --lr-range (and --batch-sizes, --clip-floors)")
    p.add_argument("--lrs", type=_numbers(float, "--lrs"), default=None,
                   help="grid: learning rates, comma-separated (default 0.01,...,1)")
    p.add_argument("--trials", type=int, default=None, help="random: trials per cell (default 20)")
    p.add_argument("--lr-range", type=_numbers(float, "--lr-range"), default=None,
                   metavar="LOW,HIGH", help="random: learning rate drawn log-uniform in "
                   "[LOW, HIGH] (default 0.01,1)")
    p.add_argument("--batch-sizes", type=_numbers(int, "--batch-sizes"), default=None,
                   help="random: batch sizes to draw from, comma-separated (default: the cell's)")
    p.add_argument("--clip-floors", type=_numbers(float, "--clip-floors"), default=None,
                   help="random: clip floors (method.settings.clip_floor) to draw from")
    p.add_argument("--seeds", type=_numbers(int, "--seeds"), default=list(DEFAULT_SEEDS),
                   help="seeds of the final runs, comma-separated (default 0-4)")
    p.add_argument("--mode", choices=MODES, default="accounted",
                   help="accounted: the search's epsilon is reported; unaccounted: it is not")
    p.add_argument("--select", default="accuracy", help="validation metric to maximise")
    p.add_argument("--validation-fraction", type=float, default=0.15)
    p.add_argument("--selection-epsilon", type=float, default=None,
                   help="accounted mode: epsilon of the choice, a finite number > 0 (default: "
                        "the cell's target epsilon)")
    p.add_argument("--master-seed", type=int, default=0,
                   help="seed from which every trial's, the draws' and the selection's seeds "
                        "are spawned")
    p.add_argument("--baseline", default=None, help="method to compare with (verdict column)")
    p.add_argument("--metric", default="accuracy", help="test metric of the report")
    p.add_argument("--research", action="store_true", help="search again cells already chosen")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--jobs", type=int, default=1,
                   help="cells at a time, one process each (default 1: in this process)")
    p.add_argument("overrides", nargs="*", help="sweep overrides, e.g. method=dpsgd,dpadam")
    args = p.parse_args(argv)
    if args.strategy == "grid":
        given = [f"--{name.replace('_', '-')}" for name in _RANDOM_ONLY
                 if getattr(args, name) is not None]
        if given:
            p.error(f"{', '.join(given)}: only with --strategy random")
    elif args.lrs is not None:
        p.error("--lrs is the grid's; --strategy random draws learning rates from --lr-range")
    try:
        job_of(args)
    except ConfigError as err:
        p.error(str(err))
    return args


def job_of(args: argparse.Namespace) -> TuneJob:
    """Return the checked TuneJob of parsed ``dpbench-tune`` options (ConfigError)."""
    given = {name: getattr(args, name) for name in ("lrs", *_RANDOM_ONLY)
             if getattr(args, name) is not None}
    return make_job(args.overrides, out=args.out, seeds=args.seeds, mode=args.mode,
                    strategy=args.strategy, select=args.select,
                    validation_fraction=args.validation_fraction,
                    selection_epsilon=args.selection_epsilon, master_seed=args.master_seed,
                    jobs=args.jobs, research=args.research, **given)


def check_cells(job: TuneJob) -> list[list[str]]:
    """Return the cells of the sweep after checking each one's config and any stored choice,
    before any work (ConfigError); cells that share a key are refused (one would overwrite
    the other's choice and runs)."""
    cells = expand_cells(job.overrides)
    choices = job.out / CHOICES_NAME
    known = read_choices(choices) if choices.exists() or choices.is_symlink() else {}
    keys: dict[str, list[str]] = {}
    for cell in cells:
        cfg = compose_config([*_QUIET, *cell])
        from dpbench.spec import build_spec  # torch, Opacus: not for --help

        build_spec(cfg)  # every check a run makes before it reads data
        check_cell(cfg, job.settings)
        key = cfg_cell_key(cfg)
        if key in keys:
            raise ConfigError(f"the cells {' '.join(keys[key])} and {' '.join(cell)} are the "
                              f"same run ({key}); drop one")
        keys[key] = cell
        if not job.research:
            choice_mode(choices, known, key, cfg)  # a stored choice to be reused is checked
    return cells


def run(job: TuneJob, cells: list[list[str]]) -> Path:
    """Search every cell (``check_cells(job)``: checked once, before any work) or reuse its
    choice, train the choices on every seed; return OUT.
    Prints one line per finished cell and the progress over all of them."""
    from dpbench.utils.progress import Progress

    jobs = min(job.jobs, len(cells))
    progress = Progress(len(cells) * len(job.seeds), "runs", "dpbench-tune")
    if jobs <= 1:
        for cell in cells:
            progress.advance(len(job.seeds), run_cell(cell, job))
        return job.out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from dpbench.utils.threads import available_cores, threads_per_job

    # the sweeps' rule: cores // jobs threads each, unless OMP_NUM_THREADS says otherwise
    threads = threads_per_job(None, jobs, available_cores())
    # spawn, not fork: a forked child would inherit this process's torch thread pools
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_init_worker, initargs=(threads,)) as pool:
        for done in as_completed([pool.submit(run_cell, cell, job) for cell in cells]):
            progress.advance(len(job.seeds), done.result())  # re-raises a worker's error
    return job.out


def _init_worker(threads: int | None) -> None:
    """Set up one --jobs worker: its share of the cores (None: torch's default)."""
    logging.basicConfig(level=logging.INFO, format="[dpbench-tune] %(message)s")
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def run_cell(cell: list[str], job: TuneJob) -> str:
    """Search one cell (unless its choice is stored) and train the choice on every seed;
    return a one-line summary (the cell, its choice, its runs)."""
    from dpbench.utils.paths import path_component

    out, settings = job.out, job.settings
    choices = out / CHOICES_NAME
    cell_cfg = compose_config([*_QUIET, *cell])
    key = cfg_cell_key(cell_cfg)
    known = read_choices(choices) if choices.exists() else {}
    if job.research or choice_mode(choices, known, key, cell_cfg) != settings.mode:
        if settings.mode == "accounted":
            from dpbench.tune.search import selection_epsilon

            log.info("%s: selection epsilon %g (%s)", key, selection_epsilon(settings, cell_cfg),
                     "--selection-epsilon" if settings.selection_epsilon is not None
                     else "the cell's target epsilon")
        choice = search_cell(cell, settings, train)
        write_choice(choices, key, choice)
        log.info("%s: chose %s", key, choice["overrides"])
    digest = key.rpartition("=")[2]  # cells that differ only outside run_name get own folders
    for seed in job.seeds:
        cfg = compose_config([*_QUIET, *cell, f"seed={seed}"])
        run_dir = out / "runs" / path_component(f"{cfg.run_name}-{digest}")
        train([*cell, f"tuned={choices}", f"seed={seed}"], run_dir)
    chosen = (read_choices(choices).get(key) or {}).get("overrides", "?")
    return f"cell {' '.join(cell)}: chose {chosen}; {len(job.seeds)} seeds trained"


def by_cell(frame: Any, root: Path) -> Any:
    """Return ``frame`` with each run's label made unique per whole cell key
    (``cfg_cell_key`` of its record's config): runs that differ in any setting that changes a
    run (``trainer.epochs=1,2``) are never pooled as seeds of one row."""
    from dpbench.analysis.results import load_records, row_eps_label

    if frame.empty:
        return frame
    keys: dict[str, str] = {}
    for record in load_records(root, status=None):
        try:
            keys[str(Path(record["_path"]).parent)] = cfg_cell_key(
                OmegaConf.create(record.get("config") or {}))
        except Exception:  # noqa: BLE001 - a record without a usable config: its own cell
            keys[str(Path(record["_path"]).parent)] = f"run_dir={record['_path']}"
    frame = frame.copy()
    frame["cell_key"] = frame["run_dir"].map(keys).fillna(frame["run_dir"])
    eps = frame.apply(row_eps_label, axis=1)
    shared = frame.assign(eps=eps).groupby(["label", "dataset", "model", "tuning", "eps"],
                                           dropna=False)["cell_key"].transform("nunique") > 1
    suffix = frame["cell_key"].str.rpartition("|")[2]
    frame.loc[shared, "label"] = frame.loc[shared, "label"] + " [" + suffix[shared] + "]"
    return frame


def report(out: Path, metric: str, baseline: str | None) -> str:
    """Write and return ``OUT/report.md``: cells with CIs, tuned lr, verdicts vs baseline."""
    from dpbench.analysis.results import load_frame
    from dpbench.analysis.tables import baseline_table, cell_table, markdown_table

    frame = by_cell(load_frame(out / "runs"), out / "runs")
    text = f"# {metric}: mean ± 95 % t-interval over seeds\n\n"
    text += markdown_table(cell_table(frame, metric)) + "\n"
    lrs = frame[frame["status"] == "completed"].groupby(
        ["label", "dataset", "model", "tuning", "target_epsilon"], dropna=False)[
        ["tuned_lr", "lr_at_grid_edge"]].first()
    text += "\n## Tuned learning rates\n\n" + markdown_table(lrs.reset_index()) + "\n"
    if "total_epsilon" in frame and frame["total_epsilon"].notna().any():
        # one row per relation: totals under different relations are different guarantees
        tot = frame.groupby(["label", "target_epsilon", "neighbouring"],
                            dropna=False)["total_epsilon"].max()
        text += ("\n## Total epsilon (search + run, accounted mode, under its relation)\n\n"
                 + markdown_table(tot.reset_index()) + "\n")
    if baseline:
        text += (f"\n## Against {baseline} (paired by seed, 95 % CI)\n\n"
                 + markdown_table(baseline_table(frame, metric, baseline)
                                  .drop(columns=["ci_low", "ci_high"], errors="ignore")) + "\n")
    atomic_write_text(out / "report.md", text)  # a planted link is replaced, not followed
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
    job = job_of(args)
    logging.basicConfig(level=logging.INFO, format="[dpbench-tune] %(message)s")
    try:
        from dpbench.utils.mac import freeze_key

        freeze_key(create=True)  # the user's MAC key, read once, before any trial
        cells = check_cells(job)  # every cell and stored choice, before anything is created
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
        out = run(job, cells)
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
