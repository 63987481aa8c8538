"""Property tests: random edits of real records and of ``wall_time.json`` are each refused or
read as the true figure (docs/reliability-bad-input.md, "Files a command reads").

The records are written by real runs (a shuffled and a fixed-size training run, a
membership-inference run); hypothesis then edits the fields that carry privacy (the epsilon,
the target, the plan's facts, every ledger entry and its sampler), and the one reader
(``analysis.results``) must either refuse the file, put it apart with no epsilon, or report
the epsilon the unedited run spent. A resumed MIA record must be refused after any edit.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpbench.analysis.results import iter_records
from dpbench.runners.reproduce import BadWallTime, read_wall_time
from tests.helpers.cli import run_cli

pytestmark = pytest.mark.integration

BASE = ["dataset=digits", "model=logreg", "method=dpsgd", "privacy=eps3", "trainer.epochs=2",
        "trainer.batch_size=128"]
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def _train(entry, folder: Path, args: list[str]) -> dict[str, Any]:
    mp = pytest.MonkeyPatch()
    try:
        assert run_cli(entry, [*args, f"hydra.run.dir={folder}"], mp) == 0
    finally:
        mp.undo()
    return json.loads((folder / "results.json").read_text())


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict[str, dict[str, Any]]:
    from dpbench.audit.mia.cli import hydra_main as mia_main
    from dpbench.cli import hydra_main

    root = tmp_path_factory.mktemp("records")
    return {
        "shuffle": _train(hydra_main, root / "shuffle", [*BASE, "trainer.sampler=shuffle"]),
        "fixed_size": _train(hydra_main, root / "fixed",
                             [*BASE, "trainer.sampler=fixed_size", "privacy.accountant=rdp"]),
        "mia": _train(mia_main, root / "mia", [
            "method=dpsgd", "privacy=eps1", "trainer.epochs=1", "mia.pool_size=60",
            "mia.population_size=30", "mia.references=2", "mia.bootstrap=20",
            "trainer.batch_size=16"]),
    }


def _paths(record: dict[str, Any]) -> list[tuple]:
    """The privacy-carrying leaves of a record: (key, ...) paths."""
    out = [(k,) for k in ("epsilon", "target_epsilon", "delta", "noise_multiplier",
                          "sample_rate", "steps", "planned_steps", "participation_bands",
                          "accountant", "sampler", "private", "status", "privacy_ledger")
           if k in record]
    for i, entry in enumerate(record.get("privacy_ledger") or []):
        out += [("privacy_ledger", i, k) for k in ("steps", "noise_multiplier", "sample_rate",
                                                   "sampling") if k in entry]
        for j, _ in enumerate(entry.get("queries") or []):
            out += [("privacy_ledger", i, "queries", j, k) for k in ("sensitivity",
                                                                     "noise_std")]
        # steps_per_epoch is re-derived from N and B by the record check's own fix (another
        # change); every other fact of the sampler is edited here
        for k in sorted(entry.get("sampling") or {}):
            if k != "steps_per_epoch":
                out.append(("privacy_ledger", i, "sampling", k))
    return out


_VALUES = st.one_of(
    st.sampled_from([0.0, 0.3, 0.5, 0.999, 1.001, 2.0, 100.0]).map(lambda f: ("scale", f)),
    st.sampled_from([None, "abc", -1, 0, True, [], {}, float("nan"), float("inf"), 1e308,
                     "poisson", "rdp", "prv", "shuffle", "fixed_size", "replace_one",
                     "add_remove", "running"]).map(lambda v: ("set", v)),
    st.just(("delete", None)),
)


def _apply(record: dict[str, Any], path: tuple, how: tuple) -> None:
    node = record
    for key in path[:-1]:
        node = node[key]
    last, (kind, value) = path[-1], how
    if kind == "delete":
        if isinstance(node, dict):
            node.pop(last, None)
    elif kind == "scale":
        old = node[last]
        if isinstance(old, bool) or not isinstance(old, (int, float)):
            return
        node[last] = type(old)(old * value) if isinstance(old, int) else old * value
    else:
        node[last] = value


def _read(tmp: Path, record: dict[str, Any]) -> dict[str, Any] | str:
    folder = tmp / "r"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(record))
    [(_, read)] = list(iter_records(tmp))
    return read


def _check(tmp: Path, true: dict[str, Any], edits) -> None:
    edited = copy.deepcopy(true)
    paths = _paths(true)
    for index, how in edits:
        path = paths[index % len(paths)]
        try:
            _apply(edited, path, how)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed what this one would change
    read = _read(tmp, edited)
    if isinstance(read, str) or read.get("underived"):
        return  # refused, or shown apart with no epsilon
    assert read["epsilon"] is not None
    assert math.isclose(read["epsilon"], true["epsilon"], rel_tol=1e-6), (edits, read["epsilon"])
    target = read.get("target_epsilon")
    assert target is None or target >= read["epsilon"] * (1 - 1e-6), (edits, target)


_EDITS = st.lists(st.tuples(st.integers(0, 10_000), _VALUES), min_size=1, max_size=3)


@pytest.mark.parametrize("kind", ["shuffle", "fixed_size", "mia"])
def test_an_edited_record_is_refused_or_reads_its_true_epsilon(records, tmp_path_factory,
                                                               kind):
    true = records[kind]
    assert math.isfinite(true["epsilon"]) and true["privacy_ledger"]
    clean = _read(tmp_path_factory.mktemp("clean"), true)
    assert not isinstance(clean, str) and math.isclose(clean["epsilon"], true["epsilon"])

    @SETTINGS
    @given(edits=_EDITS)
    def check(edits):
        _check(tmp_path_factory.mktemp("edit"), true, edits)

    check()


# --- wall_time.json --------------------------------------------------------------------------

_ANY = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6), st.text(max_size=5),
                 st.floats(allow_nan=True, allow_infinity=True), st.lists(st.integers(),
                                                                          max_size=2))


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seconds=_ANY, jobs=_ANY, finished=_ANY,
       drop=st.sets(st.sampled_from(["seconds", "jobs", "finished"])))
def test_a_wall_time_is_refused_or_read_as_written(tmp_path, seconds, jobs, finished, drop):
    data = {k: v for k, v in {"seconds": seconds, "jobs": jobs, "finished": finished}.items()
            if k not in drop}
    path = tmp_path / "wall_time.json"
    path.write_text(json.dumps(data))
    try:
        read = read_wall_time(path)
    except BadWallTime as err:
        assert str(err).startswith(str(path)) and "\n" not in str(err)
        return
    assert math.isfinite(read["seconds"]) and read["seconds"] >= 0
    assert read["seconds"] == data["seconds"]
    assert read["jobs"] == data.get("jobs", 1) and 1 <= read["jobs"] <= 256
    assert isinstance(read["finished"], str)


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 80), junk=st.binary(max_size=6))
def test_a_damaged_wall_time_is_refused_or_read_as_written(tmp_path, cut, junk):
    good = json.dumps({"seconds": 61.5, "jobs": 2, "finished": "2026-12-03 10:00:00 UTC"})
    data = good.encode()[:cut] + junk + good.encode()[cut + len(junk):]
    path = tmp_path / "wall_time.json"
    path.write_bytes(data)
    try:
        read = read_wall_time(path)
    except BadWallTime as err:
        assert "\n" not in str(err)
        return
    parsed = json.loads(data)
    assert read["seconds"] == parsed["seconds"] and read["jobs"] == parsed.get("jobs", 1)
