"""The one reader of results: ``load_records`` filters by the status records really have, and
reads the un-noised diagnostics under their new key or, in older files, the old one."""

from __future__ import annotations

import json
from pathlib import Path

from dpbench.analysis.results import UNREADABLE, load_frame, load_records, record_row
from dpbench.logging.records import (
    COMPLETED,
    FAILED,
    OLD_DIAGNOSTICS_KEY,
    RUNNING,
    UNPRIVATISED_DIAGNOSTICS,
    unprivatised,
)
from dpbench.logging.results import ResultsStore


def _record(status: str, seed: int = 0, **extra) -> dict:
    return {"status": status, "method": "dpsgd", "method_name": "dpsgd", "dataset": "digits",
            "model": "mlp", "seed": seed, "target_epsilon": 1.0, "epsilon": 0.99,
            "metrics": {"accuracy": 0.9}, **extra}


def _write(root: Path, name: str, content) -> None:
    (root / name).mkdir(parents=True)
    text = content if isinstance(content, str) else json.dumps(content)
    (root / name / "results.json").write_text(text)


def test_the_statuses_are_the_ones_the_writer_uses():
    """The reader's default is the status the results store writes at the end of a run: a
    filter on a word no record has (once ``finished``) selects nothing and fails silently."""
    import inspect

    source = inspect.getsource(ResultsStore)
    assert "COMPLETED" in source and "RUNNING" in source
    assert (COMPLETED, RUNNING, FAILED) == ("completed", "running", "failed")


def test_load_records_keeps_the_completed_ones_by_default(tmp_path):
    _write(tmp_path / "sweep", "a", _record(COMPLETED, 0))
    _write(tmp_path / "sweep", "b", _record(RUNNING, 1))
    _write(tmp_path / "sweep", "c", _record(FAILED, 2))
    _write(tmp_path / "sweep", "d", _record("finished", 3))  # no writer says this
    _write(tmp_path, "e", "{not json")
    done = load_records(tmp_path)
    assert [r["seed"] for r in done] == [0]
    assert done[0]["_sweep"] == "sweep" and done[0]["_path"].endswith("a/results.json")
    assert [r["seed"] for r in load_records(tmp_path, status=(RUNNING, FAILED))] == [1, 2]
    assert len(load_records(tmp_path, status=None)) == 4  # readable ones, any status
    every = load_records(tmp_path, status=None, unreadable=True)  # by path: e/ first
    assert [r["status"] for r in every] == [UNREADABLE, COMPLETED, RUNNING, FAILED, "finished"]
    assert every[0]["_sweep"] == "e" and "not JSON" in every[0]["error"]


def test_an_old_file_reads_its_diagnostics_under_the_new_key(tmp_path):
    diagnostics = {"note": "NOT PRIVATISED", "final": {"grad_norm_median": 1.3}}
    old = _record(COMPLETED, 0, **{OLD_DIAGNOSTICS_KEY: diagnostics})
    new = _record(COMPLETED, 1, **{UNPRIVATISED_DIAGNOSTICS: diagnostics})
    assert unprivatised(old) == unprivatised(new) == diagnostics
    assert unprivatised(_record(COMPLETED)) is None
    _write(tmp_path, "old", old)
    _write(tmp_path, "new", new)
    records = load_records(tmp_path)
    assert [r[UNPRIVATISED_DIAGNOSTICS] for r in records] == [diagnostics, diagnostics]
    assert all(OLD_DIAGNOSTICS_KEY not in r for r in records)
    # never tabulated, under either key
    for record in (old, new):
        assert not set(record_row(record)) & {OLD_DIAGNOSTICS_KEY, UNPRIVATISED_DIAGNOSTICS}
    frame = load_frame(tmp_path)
    assert len(frame) == 2 and "grad_norm_median" not in frame
    assert not set(frame.columns) & {OLD_DIAGNOSTICS_KEY, UNPRIVATISED_DIAGNOSTICS, "_path"}
