"""The design as dpbench-reproduce records and plans it: declared before its runs, one
follow-up sized by the hints within the budget, a third look refused, the claims read in
their stages."""

from __future__ import annotations

import json

import pytest

from dpbench.analysis.design import Stages
from dpbench.runners.adaptive import (
    DESIGN_NAME,
    DesignError,
    declare,
    load_stages,
    plan_follow_up,
)
from tests.helpers.report_records import with_ledger


def test_the_design_is_declared_once_and_a_third_look_is_refused(tmp_path):
    declare(tmp_path, [0, 1, 2, 3, 4])
    assert load_stages(tmp_path) == Stages((0, 1, 2, 3, 4), ())
    declare(tmp_path, [0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 6, 7])
    assert load_stages(tmp_path) == Stages((0, 1, 2, 3, 4), (5, 6, 7))
    declare(tmp_path, [0, 1, 2, 3, 4], [5, 6])   # within the recorded follow-up: resumes it
    assert load_stages(tmp_path).follow_up == (5, 6, 7)
    before = (tmp_path / DESIGN_NAME).read_text()
    with pytest.raises(DesignError, match="third look"):
        declare(tmp_path, [0, 1, 2, 3, 4], [8, 9])
    with pytest.raises(DesignError, match="neither its pilot nor its follow-up"):
        declare(tmp_path, [0, 1, 2, 10])
    assert (tmp_path / DESIGN_NAME).read_text() == before   # nothing half-written


def _row(cid, verdict, needed):
    return {"id": cid, "verdict": verdict, "seeds_follow_up": needed}


def test_the_follow_up_takes_the_cheapest_claims_the_budget_allows():
    rows = [_row("a", "underpowered", 10), _row("b", "underpowered", 40),
            _row("c", "reproduced", None), _row("d", "underpowered", ">1000"),
            _row("e", "underpowered", 12)]
    sweeps = {"a": ["s1", "s2"], "b": ["s3"], "c": ["s1"], "d": ["s1"], "e": ["s1", "s2"]}
    per_seed = {"s1": 1.0, "s2": 1.0, "s3": 2.0}
    raised, plan = plan_follow_up(rows, sweeps, per_seed, 5, budget_runs=30)
    # a (20 runs) then e shares a's sweeps (12 seeds: 24 runs in all); b's 80 runs do not fit
    assert raised == {"a": 15, "e": 17}
    assert plan["b"]["status"] == "futile" and "80 runs" in plan["b"]["why"]
    assert plan["c"]["status"] == "decided at the pilot"
    assert plan["d"]["status"] == "futile"
    raised, plan = plan_follow_up(rows, sweeps, per_seed, 5, budget_runs=None)
    assert raised == {"a": 15, "b": 45, "e": 17}


def test_a_plain_run_with_more_seeds_is_the_designs_follow_up(tmp_path):
    """The claims of a paper with a recorded design are read in its stages: a seed beyond
    both is noted and not used."""
    from dpbench.runners.reproduce import paper_claims

    declare(tmp_path, [0, 1, 2, 3, 4], [5, 6, 7, 8, 9])
    for s in range(11):
        for method, acc in (("a", 0.60 + 0.01 * (s % 3)), ("b", 0.5)):
            folder = tmp_path / "grid" / f"{method}{s}"
            folder.mkdir(parents=True)
            (folder / "results.json").write_text(json.dumps(with_ledger(
                {"status": "completed", "dataset": "mnist", "model": "cnn2", "config": {},
                 "method_name": method, "method": method, "seed": s,
                 "target_epsilon": 1.0, "metrics": {"accuracy": acc}})))
    spec = {"short": "P", "claims": [{"id": "c", "claim": "a beats b", "metric": "accuracy",
                                      "method": "a", "baseline": "b", "paper_effect": 0.1,
                                      "where": {"target_epsilon": 1.0}}]}
    [row] = paper_claims("p", spec, tmp_path)
    assert row["design"] == "5 + 5"
    assert any("seed(s) 10 outside the design" in n for n in row["notes"])
    assert row["verdict"] == "reproduced"


def test_the_default_pilot_follows_the_papers_claims():
    """``default_pilot``: 10 seeds a cell for a paper with a one-sided claim of several cells
    (the every-cell hint's calibration reads the cells' SD pattern off the pilot), 5 for one
    whose claims have one cell each or are equivalences; the shipped specs agree."""
    from dpbench.analysis.design import PILOT_SEEDS, PILOT_SEEDS_CELLS
    from dpbench.runners.adaptive import default_pilot
    from dpbench.runners.reproduce import load_spec

    one = {"claims": [{"kind": "superiority", "where": {"target_epsilon": 1.0}}]}
    several = {"claims": [{"kind": "superiority", "where": {"target_epsilon": [1.0, 8.0]}}]}
    tost = {"claims": [{"kind": "equivalence", "where": {"target_epsilon": [1.0, 8.0]}}]}
    assert (PILOT_SEEDS, PILOT_SEEDS_CELLS) == (5, 10)
    assert default_pilot(one) == default_pilot(tost) == default_pilot({}) == 5
    both = {"claims": one["claims"] + several["claims"]}
    assert default_pilot(several) == default_pilot(both) == 10
    assert default_pilot(load_spec("fiber")) == 10
    assert default_pilot(load_spec("dp_ivon")) == 5
