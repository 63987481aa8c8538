"""``dpbench-report DIR``: gather every results.json under DIR into tables and a plot.

The console script runs ``main`` here (also ``python -m dpbench.analysis.report DIR``).

Prints a method x epsilon table (mean ± 95 % t-interval over seeds, with n; markdown) and,
with ``--baseline NAME``, the difference of every method to that baseline paired by seed,
its 95 % interval and a verdict better / worse / tie. Writes, into DIR: ``report.md``,
``report.csv`` (the aggregated table), ``report.tex`` (LaTeX; the best method of a column in
bold only where significantly best), ``runs.csv`` (one row per run, failed ones with their
error) and ``privacy_utility.png`` (95 % bands); where audits or membership inference ran,
``empirical.csv`` (``analysis.empirical``: privacy measured beside utility, per cell) and
``privacy_empirical.png``. A failed run shows as failed, not missing;
a results.json that cannot be read is listed with the reason (docs/tuning-and-claims.md).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from dpbench.logging.records import COMPLETED, FAILED
from dpbench.utils.io import atomic_write_bytes

if TYPE_CHECKING:
    import pandas as pd

    from dpbench.analysis.results import load_frame as load_runs
    from dpbench.analysis.tables import latex_text, markdown_text

__all__ = ["build_report", "latex_text", "load_runs", "markdown_text", "main"]

#: names this module hands on from the readers it uses (imported on first use: ``--help``
#: imports neither pandas nor scipy)
_LAZY = {"load_runs": ("dpbench.analysis.results", "load_frame"),
         "latex_text": ("dpbench.analysis.tables", "latex_text"),
         "markdown_text": ("dpbench.analysis.tables", "markdown_text")}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _fmt(values: pd.Series) -> str:
    from dpbench.analysis.stats import t_interval

    return t_interval(values.dropna().tolist()).format()


#: a cell of the utility table (``dpbench.analysis.tables``), plus the seed: one run each
_RUN_KEYS = ("label", "dataset", "model", "tuning", "unit", "eps", "seed")


def is_audit(frame: pd.DataFrame) -> pd.Series:
    """Return which rows are ``dpbench-audit`` runs (their own table, never the utility one)."""
    import pandas as pd

    kind = frame["kind"] if "kind" in frame else pd.Series(None, index=frame.index)
    lower = (frame["epsilon_lower"] if "epsilon_lower" in frame
             else pd.Series(None, index=frame.index))
    return (kind == "audit") | lower.notna()


def split_duplicates(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return (frame with one completed run per cell and seed, the duplicate rows left out).

    Copies of one run (the same cell and seed in two folders) are not independent seeds: the
    first by folder name is kept, the others are listed, so n counts distinct seeds.
    """
    from dpbench.analysis.results import row_eps_label

    done = frame[frame["status"] == COMPLETED]
    if done.empty:
        return frame, frame.iloc[0:0]
    unit = done["unit"].fillna("example") if "unit" in done else "example"
    keys = done.assign(eps=done.apply(row_eps_label, axis=1), unit=unit)[
        list(_RUN_KEYS)].astype(str)
    duplicated = keys.duplicated(keep="first")
    dropped = done[duplicated]
    return frame.drop(index=dropped.index), dropped


def audit_summary(frame: pd.DataFrame) -> pd.DataFrame | None:
    """Return epsilon_claimed vs epsilon_lower per method and audit setting (``dpbench-audit``
    runs; copies of one run once), or None. A lower bound is shown as its largest value over
    seeds with the seed and the ceiling (``empirical.largest_bound``), never averaged."""
    import pandas as pd

    from dpbench.analysis.empirical import differing_keys, drop_copies, largest_bound, violations
    from dpbench.analysis.results import row_eps_label

    if "epsilon_lower" not in frame or not frame["epsilon_lower"].notna().any():
        return None
    audited = frame[frame["epsilon_lower"].notna()]
    audited, _ = drop_copies(audited.assign(eps=audited.apply(row_eps_label, axis=1)))
    setting = (audited["measurement_setting"].fillna("{}") if "measurement_setting" in audited
               else pd.Series("{}", index=audited.index))
    names = dict(zip(sorted(set(setting)), differing_keys(sorted(set(setting)))))
    rows = []
    for (label, dataset, model, chosen), group in audited.groupby(
            ["label", "dataset", "model", setting], dropna=False):
        rows.append({"label": label, "dataset": dataset, "model": model,
                     "setting": ", ".join(f"{k}={v}" for k, v in names[chosen].items()),
                     "epsilon_claimed": _fmt(group["epsilon_claimed"]),
                     "epsilon_lower": largest_bound(group, "epsilon_lower", "audit_ceiling"),
                     "epsilon_lower_fdp": largest_bound(group, "epsilon_lower_fdp",
                                                        "audit_ceiling_fdp"),
                     "audit_power": _fmt(group.get("audit_power", pd.Series(dtype=float))),
                     "runs": len(group), "warning": "; ".join(violations(group))})
    return pd.DataFrame(rows).set_index(["label", "dataset", "model"])


def sampler_gap(frame: pd.DataFrame) -> pd.DataFrame | None:
    """Return, per non-Poisson run cell, under the run's relation (``neighbouring``): the
    valid epsilon, the lower bound and the Poisson figure (NOT valid for those runs); and,
    in its own column, the Poisson figure under add/remove, the one such runs are often
    published with (docs/sampling.md). None if every run is Poisson."""
    from dpbench.analysis.results import row_eps_label

    if "epsilon_if_poisson" not in frame or not frame["epsilon_if_poisson"].notna().any():
        return None
    runs = frame[frame["epsilon_if_poisson"].notna()]
    runs = runs.assign(eps=runs.apply(row_eps_label, axis=1))
    return runs.groupby(["label", "dataset", "model", "eps", "neighbouring"],
                        dropna=False).agg(
        epsilon_valid=("epsilon", _fmt),
        epsilon_lower_bound=("epsilon_lower_bound", _fmt),
        epsilon_if_poisson_NOT_VALID=("epsilon_if_poisson_same_relation", _fmt),
        epsilon_if_poisson_add_remove_NOT_VALID=("epsilon_if_poisson", _fmt),
        runs=("epsilon", "size"))


def build_report(root: str | Path, metric: str = "accuracy",
                 baseline: str | None = None) -> tuple[pd.DataFrame, str]:
    """Write the report files into ``root``; return (runs frame, markdown text)."""
    import pandas as pd

    from dpbench.analysis.empirical import empirical_plot, empirical_table, is_mia
    from dpbench.analysis.plots import privacy_utility
    from dpbench.analysis.results import RESULTS_NAME, UNDERIVED_LABEL, UNREADABLE, load_frame
    from dpbench.analysis.tables import (
        baseline_table,
        cell_table,
        latex_table,
        markdown_table,
        markdown_text,
    )

    root = Path(root)
    frame = load_frame(root)
    if frame.empty:
        raise SystemExit(f"dpbench-report: no {RESULTS_NAME} under {root}")
    if metric not in frame:
        frame[metric] = None
    readable = frame[frame["status"] != UNREADABLE]
    audits = readable[is_audit(readable)]
    joint = empirical_table(readable, metric)  # utility, audit and MIA runs side by side
    readable, duplicates = split_duplicates(readable[~is_audit(readable) & ~is_mia(readable)])
    if readable.empty:
        table = pd.DataFrame()
        markdown = (f"No utility runs under {markdown_text(root)} (only audits or membership "
                    "inference, below)." if not joint.empty
                    else f"No readable {RESULTS_NAME} under {markdown_text(root)}.")
    else:
        table = cell_table(readable, metric)
        markdown = markdown_table(table)
    if baseline and not readable.empty:
        versus = baseline_table(readable, metric, baseline)
        markdown += (f"\n\nAgainst {markdown_text(baseline)} (difference paired by seed, "
                     "95 % CI, verdict):\n\n"
                     + (markdown_table(versus.drop(columns=["ci_low", "ci_high"]))
                        if not versus.empty else f"(no {markdown_text(baseline)} runs to pair)"))
    gap = sampler_gap(readable) if not readable.empty else None
    if gap is not None:
        markdown += ("\n\nSamplers other than Poisson, each row under its relation "
                     "(neighbouring): the valid epsilon, a lower bound on any valid one and "
                     "the epsilon a Poisson accountant would give for the same noise (NOT "
                     "valid for these runs); the last epsilon column is the Poisson figure "
                     "under add/remove, whatever the run's relation (docs/sampling.md):\n\n"
                     + markdown_table(gap.reset_index()))
    audit = audit_summary(audits) if not audits.empty else None
    if audit is not None:
        markdown += ("\n\nEmpirical audit (epsilon_lower must not exceed epsilon_claimed; "
                     "audit runs, not in the table above):\n\n"
                     + markdown_table(audit.reset_index()))
    if not joint.empty:
        markdown += ("\n\nPrivacy measured beside utility (per cell: utility runs, the accounted "
                     "epsilon, audits and membership inference, never pooled):\n\n"
                     + markdown_table(joint))
    if not duplicates.empty:
        markdown += ("\n\nDuplicate runs (the same cell and seed as a run above; not counted):\n"
                     + "\n".join(f"- {markdown_text(r.run_dir)}" for r in duplicates.itertuples()))
    # a failed run is listed once, with its error, below
    underived = (readable[(readable["underived"] == True) & (readable["status"] != FAILED)]  # noqa: E712
                 if "underived" in readable else readable.iloc[:0])
    if not underived.empty:
        markdown += (f"\n\nRuns whose epsilon cannot be derived (no privacy_ledger): under "
                     f"'{UNDERIVED_LABEL}', never under an epsilon, on no curve:\n" + "\n".join(
                         f"- {markdown_text(r.run_dir)}" for r in underived.itertuples()))
    for status, title in ((FAILED, "Failed runs"), (UNREADABLE, "Unreadable results")):
        listed = frame[frame["status"] == status]
        if not listed.empty:
            markdown += f"\n\n{title}:\n" + "\n".join(
                f"- {markdown_text(r.run_dir)}: {markdown_text(r.error)}"
                for r in listed.itertuples())
    files = {"report.md": f"# {markdown_text(metric)}\n\n{markdown}\n",
             "report.csv": table.to_csv(),
             "report.tex": latex_table(readable, metric) if not readable.empty
             else "% no readable runs\n",
             "runs.csv": frame.to_csv(index=False),
             **({"empirical.csv": joint.to_csv(index=False)} if not joint.empty else {})}
    for name, text in files.items():
        atomic_write_bytes(root / name, text.encode())
    if not readable.empty:
        privacy_utility(readable, metric, root / "privacy_utility.png")
    empirical_plot(frame[frame["status"] != UNREADABLE], root / "privacy_empirical.png")
    return frame, markdown


#: the environment fields the report groups runs by (results.json's ``environment``)
ENVIRONMENT_COLUMNS = ("python", "torch", "opacus", "dp_accounting", "numpy", "device_name",
                       "torch_threads", "cpu_capability", "git_dirty")


def environment_table(root: str | Path) -> pd.DataFrame:
    """Return one row per distinct environment under ``root`` with its number of runs.

    Runs whose numbers differ only by library versions, device, threads or CPU kernels can be
    told apart here; records written before the block existed show as unknown.
    """
    import pandas as pd

    from dpbench.analysis.results import load_records

    rows = [{key: (record.get("environment") or {}).get(key, "unknown")
             for key in ENVIRONMENT_COLUMNS}
            for record in load_records(root, status=None)]
    if not rows:
        return pd.DataFrame(columns=[*ENVIRONMENT_COLUMNS, "runs"])
    frame = pd.DataFrame(rows).astype(str)
    return frame.groupby(list(ENVIRONMENT_COLUMNS)).size().rename("runs").reset_index()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dpbench-report",
        description="Gather results.json files under DIR into a method x epsilon table "
                    "(mean ± 95 % t-interval over seeds, n; markdown on stdout; CSV, LaTeX, "
                    "runs.csv and a privacy-utility PNG written into DIR). Failed runs are "
                    "listed as failed.")
    parser.add_argument("dir", help="a sweep directory, e.g. outputs/multirun/<sweep>")
    parser.add_argument("--metric", default="accuracy",
                        help="metric from results.json's metrics (default: accuracy)")
    parser.add_argument("--baseline", default=None,
                        help="method to compare every other one with (paired by seed)")
    parser.add_argument("--environment", action="store_true",
                        help="also list the environments the runs ran in (versions, device, "
                             "threads, CPU kernels)")
    args = parser.parse_args(argv)
    from dpbench.analysis.tables import markdown_table  # after --help: pandas

    if not Path(args.dir).is_dir():
        print(f"dpbench-report: error: {args.dir} is not a folder", file=sys.stderr)
        return 2
    try:
        _, markdown = build_report(args.dir, args.metric, args.baseline)
    except OSError as err:
        print(f"dpbench-report: error: cannot write the report into {args.dir}: "
              f"{err.strerror or err} ({err.filename or args.dir})", file=sys.stderr)
        return 2
    print(f"{args.metric} (mean ± 95 % t-interval over seeds, n)\n")
    print(markdown)
    if args.environment:
        print("\nEnvironments:\n\n" + markdown_table(environment_table(args.dir)))
    print(f"\nwritten: {Path(args.dir) / 'report.md'}, report.csv, report.tex, runs.csv, "
          "privacy_utility.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
