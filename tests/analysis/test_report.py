"""``dpbench-report`` survives any results.json it finds and escapes what it writes."""

from __future__ import annotations

import pytest

from dpbench.analysis.report import build_report, latex_text, markdown_text
from tests.helpers.report_records import record as _record
from tests.helpers.report_records import write_record_file as _write

BROKEN = {
    "list": ([_record()], "expected a JSON object, got list"),
    "string": ("\"completed\"", "expected a JSON object, got str"),
    "number": ("3", "expected a JSON object, got int"),
    "not json": ("{\"status\": ", "unreadable results.json"),
    "no status": ({k: v for k, v in _record().items() if k != "status"},
                  "missing key(s) status"),
    "no method": ({k: v for k, v in _record().items() if k not in ("method", "method_name")},
                  "missing key(s) method"),
    "epsilon as text": (_record(eps=1.0) | {"target_epsilon": "three"},
                        "target_epsilon has the wrong type (str: 'three')"),
    "metrics as list": (_record() | {"metrics": [0.9]}, "metrics has the wrong type (list"),
    "status as number": (_record() | {"status": 5}, "status has the wrong type (int"),
    "dataset as dict": (_record() | {"dataset": {"name": "digits"}},
                        "dataset has the wrong type (dict"),
    "epsilon as bool": (_record() | {"target_epsilon": True},
                        "target_epsilon has the wrong type (bool"),
}


def test_broken_records_are_listed_and_the_rest_still_reported(tmp_path):
    good = [_record(seed=0, acc=0.8), _record(seed=1, acc=0.9), _record(eps=8.0, acc=0.95)]
    for i, record in enumerate(good):
        _write(tmp_path, f"good{i}", record)
    for name, (content, _) in BROKEN.items():
        _write(tmp_path, name.replace(" ", "_"), content)
    frame, markdown = build_report(tmp_path)
    # mean ± t_{0.975,1} s / sqrt(2) with s = 0.0707 over the two seeds; one run at eps 8
    assert "0.8500 ± 0.6353 (n=2)" in markdown and "0.9500 (n=1)" in markdown
    listed = markdown.split("Unreadable results:")[1]
    for name, (_, reason) in BROKEN.items():
        line = next(ln for ln in listed.splitlines() if f"/{name.replace(' ', '_')}:" in ln)
        assert reason in line, (name, line)
    table = markdown.split("\n\n")[0]
    assert "?" not in table and table.count("\n") == 2  # header, rule, the one dpsgd row
    assert (frame["status"] == "unreadable").sum() == len(BROKEN)
    for name in ("report.md", "report.csv", "report.tex", "runs.csv", "privacy_utility.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_only_broken_records_still_give_a_report(tmp_path):
    _write(tmp_path, "a", [1, 2])
    _, markdown = build_report(tmp_path)
    assert "No readable results.json" in markdown and "expected a JSON object" in markdown


def test_private_diagnostics_are_not_shown(tmp_path):
    _write(tmp_path, "a", _record(private_diagnostics={"grad_norm_median": 1.3}))
    frame, markdown = build_report(tmp_path)
    assert "private_diagnostics" not in frame and "grad_norm" not in markdown
    assert "grad_norm" not in (tmp_path / "runs.csv").read_text()


NASTY = "we|ird\nname_&%$#{x}~^\\"


def test_markdown_cells_and_failures_are_escaped(tmp_path):
    _write(tmp_path, "a", _record(method=NASTY))
    _write(tmp_path, "b", _record(method="dpsgd") | {
        "status": "failed", "error": "ValueError: line one\nline | two"})
    _, markdown = build_report(tmp_path)
    table = [ln for ln in markdown.split("\n\n")[0].splitlines()]
    assert len(table) == 4  # header, rule, two rows: no row broken by a newline
    assert all(ln.count("|") - ln.count("\\|") == table[0].count("|") for ln in table)
    assert "we\\|ird name_&%$#{x}~^\\\\" in markdown
    assert "- " in markdown and "ValueError: line one line \\| two" in markdown


def test_latex_table_is_escaped(tmp_path):
    _write(tmp_path, "a", _record(method=NASTY))
    build_report(tmp_path)
    tex = (tmp_path / "report.tex").read_text()
    assert (r"we|ird name\_\&\%\$\#\{x\}\textasciitilde{}\textasciicircum{}\textbackslash{}"
            in tex)
    assert "0.900" in tex and "name_&" not in tex


@pytest.mark.parametrize("text,expected", [
    ("a_b", r"a\_b"), ("50%", r"50\%"), ("x & y", r"x \& y"), ("$1", r"\$1"), ("#1", r"\#1"),
    ("{a}", r"\{a\}"), ("~", r"\textasciitilde{}"), ("^", r"\textasciicircum{}"),
    ("\\", r"\textbackslash{}"), ("0.5 ± 0.1", r"0.5 $\pm$ 0.1"), ("a\nb", "a b"),
])
def test_latex_text(text, expected):
    assert latex_text(text) == expected


def test_baseline_comparison_gives_paired_verdicts(tmp_path):
    for seed, (a, b) in enumerate([(0.90, 0.80), (0.92, 0.81), (0.91, 0.83)]):
        _write(tmp_path, f"a{seed}", _record(method="fiber", seed=seed, acc=a))
        _write(tmp_path, f"b{seed}", _record(method="dpsgd", seed=seed, acc=b))
    _, markdown = build_report(tmp_path, baseline="dpsgd")
    versus = markdown.split("Against dpsgd")[1]
    assert "fiber" in versus and "better" in versus and "| 3 " in versus
    assert r"\textbf{" in (tmp_path / "report.tex").read_text()  # significantly best


def test_markdown_text():
    assert markdown_text("a|b\r\nc") == "a\\|b c"
