"""``dpbench-reproduce``: run a paper's reproduction from its spec, then its tables and claims.

    dpbench-reproduce fiber                      # one paper, CPU scale
    dpbench-reproduce all --jobs 2               # every spec, two runs at a time
    dpbench-reproduce fiber --scale paper        # the paper's own scale (GPU)
    dpbench-reproduce all --claims-only          # rebuild claims.md from finished runs
    dpbench-reproduce dp_ivon --until-decided --budget 200   # the two-stage design

A spec is ``conf/reproduce/<paper>.yaml``: the preset of each scale, the sweeps (plain Hydra
sweeps, or tuned per cell with ``dpbench-tune``), the table columns and the paper's claims
(``dpbench.analysis.claims``); a sweep with ``program: mia`` runs ``dpbench-mia`` per cell
instead of ``dpbench`` (membership inference, docs/empirical-privacy.md). Every paper shares
the options below (output folder, seeds, parallelism, data root). Runs are resumed: rerunning
skips finished runs and searches.
Writes ``OUT/reproduce/<scale>/<paper>/<sweep>/...`` with ``tables.md`` beside, and
``OUT/claims/claims.md`` (every claim of every spec, from whatever runs exist).
"""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from dpbench.logging.records import COMPLETED, FAILED
from dpbench.runners.stopping import PREEMPTED_EXIT_CODE, Stopped, run_child, stop_on_signals
from dpbench.tune.choices import CHOICES_NAME
from dpbench.utils.io import atomic_write_text, open_append
from dpbench.utils.progress import Progress, minutes
from dpbench.utils.safe_json import UnsafeFile, read_json

log = logging.getLogger("dpbench.reproduce")
SPEC_DIR = Path(__file__).resolve().parents[2] / "conf" / "reproduce"
PAPERS = ("bounded_adaclip", "fiber", "dp_ivon", "spectral", "dp_adaln", "samplers", "mia",
          "user_level")
#: what a sweep runs (its ``program``): training runs, or membership inference per cell
PROGRAMS = {"dpbench": "dpbench", "mia": "dpbench.audit.mia"}
_QUIET = ["logger=none", "trainer.progress=false"]
WALL_TIME_NAME = "wall_time.json"
#: most seeds one sweep may run (``--seeds``, ``--claim-seeds``), and most jobs at a time
MAX_SEEDS = 1000
MAX_JOBS = 256
MAX_BUDGET_RUNS = 100_000
MAX_BUDGET_MINUTES = 60 * 24 * 30  # a month; inf and nan are refused too
#: the keys a spec and each of its sweeps must have, and the optional ones (a key close to
#: one of these but not one is a typo: refused, naming it)
SPEC_KEYS = ({"paper", "short", "scales", "sweeps"}, {"seeds", "metrics", "claims", "plots"})
SWEEP_KEYS = ({"name", "overrides"}, {"tune", "tuned", "program", "metrics"})


class SpecError(ValueError):
    """A reproduction spec (``conf/reproduce/<paper>.yaml``) with a missing or mistyped key."""


class BadWallTime(ValueError):
    """A ``wall_time.json`` that is not a file dpbench-reproduce wrote."""


def _check_keys(where: str, node: Any, keys: tuple[set[str], set[str]]) -> None:
    """Raise SpecError naming the first missing required key of ``node`` (a dict), or a key
    that looks like a typo of a known one (``overides``)."""
    if not isinstance(node, dict):
        raise SpecError(f"{where} must be a mapping, got {type(node).__name__}")
    required, optional = keys
    known = required | optional
    for key in node:
        close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.75)
        if key not in known and close:
            raise SpecError(f"{where}: unknown key {key!r} (did you mean {close[0]!r}?)")
    for key in sorted(required):
        if key not in node:
            raise SpecError(f"{where}: the key {key!r} is missing")


def check_spec(paper: str, spec: Any) -> None:
    """Raise SpecError (one line naming the file and the key) for a spec whose keys or
    types are not what ``sweep_commands`` reads."""
    where = f"conf/reproduce/{paper}.yaml"
    _check_keys(where, spec, SPEC_KEYS)
    if not isinstance(spec["sweeps"], list) or not spec["sweeps"]:
        raise SpecError(f"{where}: sweeps must be a non-empty list")
    if not isinstance(spec["scales"], dict):
        raise SpecError(f"{where}: scales must be a mapping of scale -> preset")
    for i, sweep in enumerate(spec["sweeps"]):
        name = sweep.get("name", i) if isinstance(sweep, dict) else i
        _check_keys(f"{where}: sweeps[{name!r}]", sweep, SWEEP_KEYS)
        overrides = sweep["overrides"]
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            raise SpecError(f"{where}: sweeps[{name!r}].overrides must be a list of strings")


def load_spec(paper: str) -> dict[str, Any]:
    """Return the reproduction spec of ``paper`` (one of PAPERS), its claims validated
    (ClaimSpecError, one line naming the claim and the key)."""
    from dpbench.analysis.claims import validate_claim  # scipy: not for --help

    if paper not in PAPERS:
        raise SystemExit(f"dpbench-reproduce: unknown paper {paper!r} (known: "
                         f"{', '.join(PAPERS)}, all)")
    try:
        spec = yaml.safe_load((SPEC_DIR / f"{paper}.yaml").read_text())
    except yaml.YAMLError as err:
        raise SpecError(f"conf/reproduce/{paper}.yaml is not YAML "
                        f"({' '.join(str(err).split())})") from None
    check_spec(paper, spec)
    for sweep in spec["sweeps"]:
        program = sweep.get("program", "dpbench")
        if program not in PROGRAMS or (program != "dpbench" and sweep.get("tune")):
            raise SystemExit(f"dpbench-reproduce: {paper}: sweep {sweep['name']!r}: program "
                             f"{program!r} is not one of {', '.join(PROGRAMS)} (tuned sweeps "
                             "run dpbench)")
    for claim in spec.get("claims", []):
        validate_claim(claim)
    return spec


def sweep_commands(spec: dict[str, Any], args: argparse.Namespace, out: Path) -> list[dict]:
    """Return one job per sweep: its folder and either a dpbench -m command or the keyword
    arguments of a ``dpbench.tune.cli.tune`` call."""
    scale = spec["scales"][args.scale]
    base_seeds = args.seeds or spec.get("seeds", {}).get(args.scale, "0,1,2")
    raised = claim_sweep_seeds(spec, getattr(args, "claim_seeds", {}) or {})
    data = [f"paths.data_root={args.data_root}"] if args.data_root else []
    jobs = []
    for sweep in spec["sweeps"]:
        folder = out / sweep["name"]
        seeds = more_seeds(base_seeds, raised.get(sweep["name"], 0))
        overrides = [o.format(**scale) for o in sweep["overrides"]] + data + _QUIET
        if sweep.get("tuned"):  # reuse the learning rates another sweep of this paper chose
            overrides.append(f"tuned={out / sweep['tuned'] / CHOICES_NAME}")
        if sweep.get("tune"):  # dpbench-tune's options as keywords (the spec may add more)
            options = {"overrides": overrides, **sweep["tune"],
                       "seeds": [int(s) for s in str(seeds).split(",")],
                       "mode": sweep["tune"].get("mode", "unaccounted"), "out": folder,
                       "jobs": args.jobs}
            jobs.append({"folder": folder, "tune": options})
        else:
            program = PROGRAMS[sweep.get("program", "dpbench")]
            # the seeds first: Hydra's sweeper numbers the jobs of the product of the
            # overrides in their order (the first slowest), so a run keeps its job number,
            # and so its folder, when later seeds are appended (a follow-up, --claim-seeds)
            # and is resumed rather than run again
            cmd = [sys.executable, "-m", program, "-m", f"seed={seeds}", *overrides,
                   "trainer.resume=true", f"hydra.sweep.dir={folder}",
                   "hydra.sweep.subdir=${hydra.job.num}_${run_name}"]
            if args.jobs > 1:
                cmd += ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={args.jobs}"]
            jobs.append({"folder": folder, "cmd": cmd})
    return jobs


def claim_sweep_seeds(spec: dict[str, Any], wanted: dict[str, int]) -> dict[str, int]:
    """Return the seeds each sweep needs for the claims of ``wanted`` (claim id -> seeds): a
    claim's sweeps are its ``sweep`` entries, or every sweep of the paper without one."""
    out: dict[str, int] = {}
    for claim in spec.get("claims", []):
        if claim.get("id") not in wanted:
            continue
        names = claim.get("sweep") or [s["name"] for s in spec["sweeps"]]
        for name in [names] if isinstance(names, str) else names:
            out[name] = max(out.get(name, 0), int(wanted[claim["id"]]))
    return out


def more_seeds(seeds: str, n: int) -> str:
    """Return the comma-separated ``seeds`` extended to ``n`` seeds by the next integers
    after the largest (the spec's seeds first, so finished runs are reused)."""
    have = [int(v) for v in str(seeds).split(",") if v != ""]
    nxt = max(have, default=-1) + 1
    while len(have) < n:
        have.append(nxt)
        nxt += 1
    return ",".join(map(str, have))


def _seed_list(text: str) -> str:
    """Return ``text`` if it is a comma-separated list of distinct integer seeds >= 0."""
    items = [item.strip() for item in text.split(",")]
    if not items or not all(item.isdigit() for item in items) or len(set(items)) != len(items):
        raise argparse.ArgumentTypeError(f"expected distinct integer seeds >= 0 separated by "
                                         f"commas, e.g. 0,1,2 (got {text!r})")
    if len(items) > MAX_SEEDS:
        raise argparse.ArgumentTypeError(f"{len(items)} seeds, more than the {MAX_SEEDS} "
                                         "allowed")
    return ",".join(items)


def _claim_seeds(text: str) -> dict[str, int]:
    out = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if not sep or not value.isdigit() or not 2 <= int(value) <= MAX_SEEDS:
            raise argparse.ArgumentTypeError(f"expected CLAIM_ID=N (2 <= N <= {MAX_SEEDS}), "
                                             f"got {item!r}")
        out[name.strip()] = int(value)
    return out


def job_runs(job: dict) -> int:
    """Return the runs a sweep job trains: its cells (the product of the ``key=a,b``
    overrides, seeds included) times the seeds of a tuned sweep (its searches not counted)."""
    from dpbench.tune.search import expand_cells

    if "tune" in job:
        return len(expand_cells(job["tune"]["overrides"])) * len(job["tune"]["seeds"])
    overrides = [w for w in job["cmd"][job["cmd"].index("-m", 3) + 1:]
                 if "=" in w and not w.startswith("hydra")]
    return len(expand_cells(overrides))


def run_jobs(jobs: list[dict], dry_run: bool, progress: Progress | None = None,
             label: str = "") -> None:
    """Run each sweep (a failing run is recorded by dpbench and the others go on); with
    ``progress``, count each sweep's runs when it finishes and print where the whole is."""
    from dpbench.analysis.results import load_records

    for job in jobs:
        start = time.perf_counter()
        if not dry_run:
            job["folder"].mkdir(parents=True, exist_ok=True)
        if "tune" in job:
            from dpbench.tune.cli import command_line, tune

            print(command_line(**job["tune"]), flush=True)
            if not dry_run:
                tune(**job["tune"])
        else:
            print(" ".join(job["cmd"]), flush=True)
            if not dry_run:
                # a planted link in place of the log is refused, never followed
                with open_append(job["folder"].with_suffix(".log"), truncate=True) as logfile:
                    # its own process group: stopped with this command (``run_child``)
                    run_child(job["cmd"], stdout=logfile, stderr=subprocess.STDOUT,
                              env={**os.environ, "WANDB_MODE": "disabled"})
        if progress is not None and not dry_run:
            runs = job_runs(job)
            failed = len(load_records(job["folder"], status=FAILED))
            progress.advance(runs, f"{label}{job['folder'].name}: {runs} runs ({failed} "
                                   f"failed) in {minutes(time.perf_counter() - start)}")


def paper_summary(paper: str, spec: dict[str, Any], out: Path,
                  seconds: float | None) -> str:
    """Return one line for a finished paper: its time (None: nothing was run) and its
    claims' verdicts (decided within the paper)."""
    from dpbench.analysis.claims import VERDICTS, adjust

    rows = adjust(paper_claims(paper, spec, out))
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    done = f"done in {minutes(seconds)}; " if seconds is not None else ""
    return f"{paper} {done}claims: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n)


def paper_tables(spec: dict[str, Any], out: Path) -> str:
    """Return the paper's tables (one per sweep and metric) with CIs."""
    from dpbench.analysis.results import load_frame
    from dpbench.analysis.tables import cell_table, markdown_table

    text = [f"# {spec['paper']}\n"]
    for sweep in spec["sweeps"]:
        frame = load_frame(out / sweep["name"])
        for metric in sweep.get("metrics", spec.get("metrics", ["accuracy"])):
            table = cell_table(frame, metric) if not frame.empty else frame
            text.append(f"## {sweep['name']}: {metric} (mean ± 95 % CI, n)\n\n"
                        + markdown_table(table) + "\n")
    return "\n".join(text)


def paper_plots(spec: dict[str, Any], out: Path) -> None:
    """Write the spec's Pareto scatters (``plots``), one per data set, over all its runs."""
    from dpbench.analysis.plots import pareto
    from dpbench.analysis.results import load_frame

    frame = load_frame(out)
    for plot in spec.get("plots", []):
        if frame.empty or not {plot["x"], plot["y"]} <= set(frame.columns):
            continue
        for dataset, group in frame.groupby("dataset"):
            pareto(group, plot["x"], plot["y"], out / f"pareto_{dataset}_{plot['y']}.png",
                   str(dataset))


def paper_claims(paper: str, spec: dict[str, Any], out: Path) -> list[dict[str, Any]]:
    """Return the evaluated claims of ``paper`` over every finished run under ``out`` (failed
    runs count: ``evaluate_claim``), in the stages of its recorded design (``design.json``;
    none: one fixed look)."""
    from dpbench.analysis.claims import evaluate_claim
    from dpbench.analysis.results import load_records
    from dpbench.runners import adaptive

    records = load_records(out, status=(COMPLETED, FAILED)) if out.exists() else []
    stages = adaptive.load_stages(out)
    design = adaptive.load_design(out)
    rows = []
    for claim in spec.get("claims", []):
        row = evaluate_claim(claim, records, stages=stages)
        row["notes"] = [*row["notes"], *adaptive.plan_notes(design, claim.get("id"))]
        rows.append({**row, "paper": spec["short"], "paper_key": paper,
                     "command": f"make reproduce-{paper.replace('_', '-')}"})
    return rows


def seeds_hint(rows: list[dict[str, Any]]) -> str:
    """Return the commands that would give each underpowered claim the seeds it needs."""
    lines = [f"dpbench-reproduce {r['paper_key']} --claim-seeds {r['id']}="
             f"{r['seeds_follow_up'] + (_pilot_n(r) if r.get('hint') == 'follow-up' else 0)}"
             for r in rows if r["verdict"] == "underpowered" and r.get("id")
             and isinstance(r.get("seeds_follow_up"), int)]
    if not lines:
        return ""
    return ("\n## Seeds that would decide the undecided claims (80 % assurance at the claimed "
            "effect, Holm level, every cell jointly; before a design's follow-up, the "
            "follow-up's seeds added to the pilot's)\n\n```\n"
            + "\n".join(lines) + "\n```\n")


def read_wall_time(path: Path) -> dict[str, Any]:
    """Return the ``wall_time.json`` at ``path``, read bounded (a FIFO or a device is refused,
    never waited on) and checked: ``seconds`` a finite number >= 0, ``jobs`` an integer >= 1,
    ``finished`` a string; BadWallTime (one line naming the file and the key) otherwise."""
    try:
        data = read_json(path, max_bytes=4096)
    except (UnsafeFile, OSError) as err:
        raise BadWallTime(f"{path}: {err}; move it away (a run rewrites it)") from None
    if not isinstance(data, dict):
        raise BadWallTime(f"{path} is not a JSON object; move it away (a run rewrites it)")
    seconds, jobs = data.get("seconds"), data.get("jobs", 1)
    if (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
            or not math.isfinite(seconds) or seconds < 0):
        raise BadWallTime(f"{path}: seconds={seconds!r} is not a finite number >= 0; move it "
                          "away (a run rewrites it)")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= MAX_JOBS:
        raise BadWallTime(f"{path}: jobs={jobs!r} is not an integer in [1, {MAX_JOBS}]; move "
                          "it away (a run rewrites it)")
    if not isinstance(data.get("finished", ""), str):
        raise BadWallTime(f"{path}: finished={data['finished']!r} is not a time; move it away "
                          "(a run rewrites it)")
    return {"seconds": float(seconds), "jobs": jobs, "finished": data.get("finished", "?")}


def _pilot_n(row: dict[str, Any]) -> int:
    return max((c["n_pilot"] for c in row["cells"]), default=0)


def recorded_wall_times(root: Path) -> dict[str, dict[str, Any]]:
    """Return each paper's last recorded wall time (``wall_time.json`` beside its runs)."""
    out = {}
    for paper in PAPERS:
        path = root / paper / WALL_TIME_NAME
        if path.exists() or path.is_symlink():
            out[paper] = read_wall_time(path)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dpbench-reproduce", description=__doc__.splitlines()[0])
    p.add_argument("papers", nargs="+", help=f"{', '.join(PAPERS)} or all")
    p.add_argument("--scale", choices=("cpu", "paper"), default="cpu")
    p.add_argument("--out", type=Path, default=Path("outputs"))
    p.add_argument("--seeds", type=_seed_list, default=None,
                   help="comma-separated seeds (default: the spec's)")
    p.add_argument("--claim-seeds", type=_claim_seeds, default={}, metavar="ID=N[,ID=N]",
                   help="raise the sweeps of these claims to N seeds each (the table's "
                        "'seeds needed'); finished runs are reused")
    p.add_argument("--jobs", type=int, default=None,
                   help="runs (or tuned cells) at a time, each with cores // jobs threads "
                        "(default: the cores, at most 8, at cpu scale; 1 at paper scale)")
    p.add_argument("--data-root", default=os.environ.get("DPBENCH_DATA_ROOT"),
                   help="folder of offline data sets (default: $DPBENCH_DATA_ROOT)")
    p.add_argument("--claims-only", action="store_true", help="only rebuild tables and claims")
    p.add_argument("--until-decided", action="store_true",
                   help="run the two-stage design: a pilot, then a follow-up sized by the "
                        "hints within the budget (docs/tuning-and-claims.md, 'The design')")
    p.add_argument("--pilot", type=int, default=None,
                   help="seeds a cell of the design's pilot (default: 5, or 10 for a paper "
                        "with a one-sided claim of several cells: design.pilot_seeds, "
                        "docs/tuning-and-claims.md; --seeds names them instead)")
    p.add_argument("--budget", type=int, default=None, metavar="RUNS",
                   help="--until-decided: the runs of both stages together, per paper")
    p.add_argument("--budget-minutes", type=float, default=None, metavar="MIN",
                   help="--until-decided: the minutes of both stages, per paper (the "
                        "follow-up at the pilot's pace)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    args.papers = list(PAPERS) if args.papers == ["all"] else args.papers
    if args.jobs is None:
        args.jobs = default_jobs(args.scale)
    if not 1 <= args.jobs <= MAX_JOBS:
        p.error(f"--jobs must be between 1 and {MAX_JOBS}, got {args.jobs}")
    # None: the design's default for each paper (``adaptive.default_pilot``)
    if args.pilot is not None and not 3 <= args.pilot <= MAX_SEEDS:
        p.error(f"--pilot must be between 3 and {MAX_SEEDS}, got {args.pilot}")
    if args.budget is not None and not 1 <= args.budget <= MAX_BUDGET_RUNS:
        p.error(f"--budget must be between 1 and {MAX_BUDGET_RUNS} runs, got {args.budget}")
    if args.budget_minutes is not None and not 0 < args.budget_minutes <= MAX_BUDGET_MINUTES:
        p.error(f"--budget-minutes must be in (0, {MAX_BUDGET_MINUTES}], got "
                f"{args.budget_minutes}")
    if (args.budget is not None or args.budget_minutes is not None) and not args.until_decided:
        p.error("--budget and --budget-minutes go with --until-decided")
    if args.until_decided and args.claim_seeds:
        p.error("--until-decided sizes the follow-up itself: drop --claim-seeds")
    return args


def default_jobs(scale: str) -> int:
    """Return the default parallelism: one job per core (at most 8) for the CPU-scale presets,
    whose runs are small enough that k one-thread jobs beat one k-thread job; one at a time at
    paper scale (a GPU run uses the whole device)."""
    from dpbench.utils.threads import available_cores

    return min(available_cores(), 8) if scale == "cpu" else 1


def wall_time_markdown(timings: dict[str, dict[str, Any]]) -> str:
    """Return each paper's last recorded wall time (empty if none was recorded)."""
    if not timings:
        return ""
    rows = "".join(f"| {paper} | {t['seconds'] / 60:.1f} | {t.get('jobs', '?')} | "
                   f"{t.get('finished', '?')} |\n" for paper, t in timings.items())
    total = sum(t["seconds"] for t in timings.values()) / 60
    return ("\n## Wall time of each paper's last run\n\n| paper | minutes | jobs at a time "
            f"| finished |\n|---|---|---|---|\n{rows}| all | {total:.1f} | | |\n")


def declare_design(spec: dict[str, Any], args: argparse.Namespace, out: Path,
                   jobs: list[dict]) -> None:
    """Record the paper's design before a plain run: its seeds are the pilot (the first run
    only), the seeds ``--claim-seeds`` adds are the follow-up (once; DesignError for a third
    look)."""
    from dpbench.runners import adaptive

    pilot = [int(s) for s in str(args.seeds or spec.get("seeds", {}).get(
        args.scale, "0,1,2")).split(",")]
    seeds = {int(s) for j in jobs for s in adaptive.job_seeds(j)}
    adaptive.declare(out, pilot, sorted(seeds - set(pilot)))


def main(argv: list[str] | None = None) -> int:
    """Console script ``dpbench-reproduce``: on Ctrl-C or SIGTERM it stops its sweeps (their
    runs checkpoint), prints one line and exits 3, like a preempted ``dpbench``."""
    try:
        with stop_on_signals():
            return _main(argv)
    except Stopped as stop:
        print(f"dpbench-reproduce: preempted by {stop.name}; the sweeps it started were "
              "stopped (their runs checkpoint): run the same command again to continue "
              "(finished runs are skipped)", file=sys.stderr, flush=True)
        return PREEMPTED_EXIT_CODE


def _main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # the claims (scipy, pandas) load only once a command runs: --help stays light
    from dpbench.analysis.claims import ClaimSpecError, adjust, claims_markdown
    from dpbench.runners import adaptive

    logging.basicConfig(level=logging.INFO, format="[dpbench-reproduce] %(message)s")
    try:
        specs = {paper: load_spec(paper) for paper in args.papers}
        # every paper's spec and wall time feed claims.md: a bad one is refused before any run
        for paper in PAPERS:
            load_spec(paper)
        if not args.dry_run:
            recorded_wall_times(args.out / "reproduce" / args.scale)
    except (ClaimSpecError, SpecError, BadWallTime) as err:  # one line naming file and key
        print(f"dpbench-reproduce: error: {err}", file=sys.stderr)
        return 2
    timings = {}
    outs = {paper: args.out / "reproduce" / args.scale / paper for paper in args.papers}
    jobs = {paper: sweep_commands(specs[paper], args, outs[paper]) for paper in args.papers}
    progress = Progress(sum(job_runs(j) for js in jobs.values() for j in js), "runs",
                        "dpbench-reproduce")
    for paper in args.papers:
        spec, out = specs[paper], outs[paper]
        start = time.perf_counter()
        if args.dry_run:  # the commands only: no folder, table or claim is written
            run_jobs(jobs[paper], dry_run=True)
            continue
        if not args.claims_only:
            try:
                if args.until_decided:
                    adaptive.until_decided(paper, spec, args, out, progress, adaptive.Runner(
                        sweep_commands, job_runs, run_jobs, paper_claims))
                else:
                    declare_design(spec, args, out, jobs[paper])
                    run_jobs(jobs[paper], dry_run=False, progress=progress, label=f"{paper}/")
            except adaptive.DesignError as err:
                print(f"dpbench-reproduce: error: {err}", file=sys.stderr)
                return 2
            timings[paper] = time.perf_counter() - start
            # kept beside the runs, so a later --claims-only rebuild still shows it
            atomic_write_text(out / WALL_TIME_NAME, json.dumps(
                {"seconds": timings[paper], "jobs": args.jobs,
                 "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}))
        if out.exists():
            atomic_write_text(out / "tables.md", paper_tables(spec, out))
            paper_plots(spec, out)
        print(f"dpbench-reproduce: {paper_summary(paper, spec, out, timings.get(paper))}",
              flush=True)
    if args.dry_run:
        return 0
    root = args.out / "reproduce" / args.scale
    rows = adjust([row for paper in PAPERS for row in paper_claims(
        paper, load_spec(paper), root / paper)])
    claims_dir = args.out / "claims"
    claims_dir.mkdir(parents=True, exist_ok=True)
    from dpbench.analysis.plots import forest_plots

    figures = forest_plots(rows, claims_dir)
    text = (f"# Claims of the reproduction specs, dpbench at {args.scale} scale\n\n"
            + claims_markdown(rows, [f.name for f in figures]) + seeds_hint(rows)
            + wall_time_markdown(recorded_wall_times(root)))
    atomic_write_text(claims_dir / "claims.md", text)
    atomic_write_text(claims_dir / "claims.json", json.dumps(rows, indent=1, default=str))
    print(text)
    for paper, seconds in timings.items():
        print(f"{paper}: {seconds / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
