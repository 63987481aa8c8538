"""``dpbench-report DIR``: gather every results.json under DIR into tables and a plot.

Prints a method x epsilon table (mean +- std over seeds, markdown) and writes, into DIR:
``report.md``, ``report.csv`` (the aggregated table), ``report.tex`` (LaTeX), ``runs.csv``
(one row per run, failed ones with their error) and ``privacy_utility.png``.
A failed run shows as failed, not missing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from dpbench.logging.results import RESULTS_NAME

KEY_COLUMNS = ["label", "dataset", "model", "target_epsilon"]
#: keys every record needs, with the types they may have
_REQUIRED: dict[str, tuple[type, ...]] = {"status": (str,), "dataset": (str,),
                                          "model": (str,)}
_OPTIONAL: dict[str, tuple[type, ...]] = {
    "method": (str,), "method_name": (str,), "error": (str,), "privacy": (str,),
    "target_epsilon": (int, float, type(None)), "epsilon": (int, float, type(None)),
    "metrics": (dict, type(None)), "private": (bool, type(None))}


class Unreadable(ValueError):
    """A results.json that cannot be reported (not JSON, not a record, wrong types)."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def record_row(record: Any) -> dict[str, Any]:
    """Return the report row of one results.json record; raise Unreadable saying why."""
    if not isinstance(record, dict):
        raise Unreadable(f"expected a JSON object, got {type(record).__name__}")
    missing = [k for k in _REQUIRED if k not in record]
    if "method" not in record and "method_name" not in record:
        missing.append("method")
    if missing:
        raise Unreadable(f"missing key(s) {', '.join(missing)}")
    for key, types in {**_REQUIRED, **_OPTIONAL}.items():
        value = record.get(key)
        if key in record and (not isinstance(value, types) or (
                isinstance(value, bool) and bool not in types)):
            raise Unreadable(f"{key} has the wrong type ({type(value).__name__}: "
                             f"{str(value)[:40]!r})")
    row = {k: v for k, v in record.items()  # private_diagnostics: never shown
           if k not in ("config", "history", "metrics", "privacy_ledger", "method_summary",
                        "private_diagnostics")
           and (v is None or isinstance(v, (str, int, float, bool)))}
    for k, v in (record.get("metrics") or {}).items():
        if _is_number(v) or v is None:
            row[k] = v
    return row


def load_runs(root: str | Path) -> pd.DataFrame:
    """Return one row per results.json under ``root``.

    A file that cannot be reported becomes a row with status ``unreadable`` and the reason in
    ``error``; it is listed, never tabulated, and the other runs are still reported.
    """
    rows: list[dict[str, Any]] = []
    for path in sorted(Path(root).rglob(RESULTS_NAME)):
        try:
            row = record_row(json.loads(path.read_text()))
        except (json.JSONDecodeError, UnicodeDecodeError, OSError, Unreadable) as err:
            row = {"status": "unreadable", "error": f"unreadable results.json: {err}"}
        row["run_dir"] = str(path.parent)
        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    for col in ("method_name", "method", "dataset", "model", "target_epsilon", "error",
                "epsilon", "private"):
        if col not in frame:
            frame[col] = None
    name = frame["method_name"].fillna(frame["method"]).fillna("?")
    nonpriv = (frame["method"] == "nonprivate") & (name != "nonprivate")
    frame["label"] = name.where(~nonpriv, name + " (non-private)")
    return frame


def markdown_text(value: Any) -> str:
    """Return ``value`` safe inside a markdown table cell or list item (one line, no pipes)."""
    text = " ".join(str(value).split())
    return text.replace("\\", "\\\\").replace("|", "\\|")


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                  "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                  "^": r"\textasciicircum{}"}


def latex_text(value: Any) -> str:
    """Return ``value`` as LaTeX text: special characters escaped, ± as $\\pm$, one line."""
    text = " ".join(str(value).split())
    text = "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)
    return text.replace("±", r"$\pm$")


def _markdown_table(table: pd.DataFrame) -> str:
    """Return ``table`` as markdown, cells escaped and printed as formatted (no re-parsing)."""
    return _escaped(table, markdown_text).to_markdown(index=False, disable_numparse=True)


def _escaped(table: pd.DataFrame, escape) -> pd.DataFrame:
    out = table.map(lambda v: v if v is None or (isinstance(v, float) and math.isnan(v))
                    else escape(v))
    out.columns = [escape(c) for c in out.columns]
    return out


def _fmt(values: pd.Series) -> str:
    values = values.dropna()
    if values.empty:
        return "n/a"
    if len(values) == 1:
        return f"{values.iloc[0]:.4f}"
    return f"{values.mean():.4f} ± {values.std(ddof=1):.4f}"


def _eps_label(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "eps=n/a"
    return f"eps={value:g}"


def summarise(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Return the method x epsilon table of ``metric`` (mean ± std over seeds; failures noted)."""
    frame = frame.copy()
    frame["eps_col"] = frame["target_epsilon"].map(_eps_label)
    cells = []
    for (label, dataset, model, eps), group in frame.groupby(
            ["label", "dataset", "model", "eps_col"], dropna=False):
        ok = group[group["status"] == "completed"]
        failed = int((group["status"] == "failed").sum())
        running = int((~group["status"].isin(["completed", "failed"])).sum())
        text = _fmt(ok[metric]) if metric in ok and not ok.empty else ""
        extra = [f"{failed} failed"] * bool(failed) + [f"{running} incomplete"] * bool(running)
        if extra:
            text = (text + " " if text else "") + "(" + ", ".join(extra) + ")"
        cells.append({"method": label, "dataset": dataset, "model": model, "eps": eps,
                      "cell": text, "n": len(ok)})
    table = pd.DataFrame(cells)
    wide = table.pivot_table(index=["method", "dataset", "model"], columns="eps", values="cell",
                             aggfunc="first")
    cols = sorted(wide.columns, key=lambda c: (c == "eps=n/a", float(c[4:]) if c[4:] not in (
        "n/a",) else math.inf))
    return wide[cols]


def plot(frame: pd.DataFrame, metric: str, path: Path) -> None:
    """Write a privacy-utility plot: metric vs target epsilon, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = frame[(frame["status"] == "completed") & frame[metric].notna()].copy()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for label, group in ok.groupby("label"):
        private = group[group["target_epsilon"].notna()]
        if label == "nonprivate" or (group["method"] == "nonprivate").all():
            ax.axhline(group[metric].mean(), ls="--", color="gray", label=f"{label}")
            continue
        stats = private.groupby("target_epsilon")[metric].agg(["mean", "std"]).reset_index()
        ax.errorbar(stats["target_epsilon"], stats["mean"], yerr=stats["std"].fillna(0),
                    marker="o", capsize=3, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("target epsilon")
    ax.set_ylabel(metric)
    ax.set_title("privacy-utility")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def audit_summary(frame: pd.DataFrame) -> pd.DataFrame | None:
    """Return epsilon_claimed vs epsilon_lower per method (``dpbench-audit`` runs), or None."""
    if "epsilon_lower" not in frame or not frame["epsilon_lower"].notna().any():
        return None
    audited = frame[frame["epsilon_lower"].notna()]
    return audited.groupby(["label", "dataset", "model"], dropna=False).agg(
        epsilon_claimed=("epsilon_claimed", _fmt), epsilon_lower=("epsilon_lower", _fmt),
        runs=("epsilon_lower", "size"))


def build_report(root: str | Path, metric: str = "accuracy") -> tuple[pd.DataFrame, str]:
    """Write the report files into ``root``; return (runs frame, markdown table)."""
    root = Path(root)
    frame = load_runs(root)
    if frame.empty:
        raise SystemExit(f"dpbench-report: no {RESULTS_NAME} under {root}")
    if metric not in frame:
        frame[metric] = None
    readable = frame[frame["status"] != "unreadable"]
    if readable.empty:
        table = pd.DataFrame()
        markdown = f"No readable {RESULTS_NAME} under {markdown_text(root)}."
    else:
        table = summarise(readable, metric)
        markdown = _markdown_table(table.reset_index())
    audit = audit_summary(readable) if not readable.empty else None
    if audit is not None:
        markdown += ("\n\nEmpirical audit (epsilon_lower must not exceed epsilon_claimed):\n\n"
                     + _markdown_table(audit.reset_index()))
    for status, title in (("failed", "Failed runs"), ("unreadable", "Unreadable results")):
        listed = frame[frame["status"] == status]
        if not listed.empty:
            markdown += f"\n\n{title}:\n" + "\n".join(
                f"- {markdown_text(r.run_dir)}: {markdown_text(r.error)}"
                for r in listed.itertuples())
    (root / "report.md").write_text(f"# {markdown_text(metric)}\n\n{markdown}\n")
    table.to_csv(root / "report.csv")
    latex = _escaped(table.reset_index(), latex_text) if not table.empty else table
    (root / "report.tex").write_text(latex.to_latex(index=False, escape=False))
    frame.drop(columns=["eps_col"], errors="ignore").to_csv(root / "runs.csv", index=False)
    if not readable.empty:
        plot(readable, metric, root / "privacy_utility.png")
    return frame, markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dpbench-report",
        description="Gather results.json files under DIR into a method x epsilon table "
                    "(mean ± std over seeds; markdown on stdout; CSV, LaTeX, runs.csv and a "
                    "privacy-utility PNG written into DIR). Failed runs are listed as failed.")
    parser.add_argument("dir", help="a sweep directory, e.g. outputs/multirun/<sweep>")
    parser.add_argument("--metric", default="accuracy",
                        help="metric from results.json's metrics (default: accuracy)")
    args = parser.parse_args(argv)
    _, markdown = build_report(args.dir, args.metric)
    print(f"{args.metric} (mean ± std over seeds)\n")
    print(markdown)
    print(f"\nwritten: {Path(args.dir) / 'report.md'}, report.csv, report.tex, runs.csv, "
          "privacy_utility.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
