"""``dpbench-report`` keeps runs of different samplers apart and shows their gap."""

from __future__ import annotations

from dpbench.analysis.report import build_report
from tests.helpers.report_records import record as _record
from tests.helpers.report_records import write_record_file as _write


def test_the_report_keeps_samplers_apart_and_labels_the_poisson_figure_not_valid(tmp_path):
    for seed in (0, 1):
        _write(tmp_path, f"p{seed}", _record(eps=3.0, seed=seed, acc=0.8, sampler="poisson",
                                            neighbouring="add_remove"))
        _write(tmp_path, f"s{seed}", _record(
            eps=3.0, seed=seed, acc=0.7, sampler="shuffle", neighbouring="replace_one",
            epsilon_if_poisson=0.4, epsilon_lower_bound=0.67))
    _, markdown = build_report(tmp_path)
    table = markdown.split("\n\n")[0]
    assert "| dpsgd " in table and "| dpsgd [shuffle]" in table  # two rows, not duplicates
    assert "Duplicate runs" not in markdown
    assert "epsilon_if_poisson_NOT_VALID" in markdown and "0.4000" in markdown
    assert "0.6700" in markdown and "replace_one" in markdown
