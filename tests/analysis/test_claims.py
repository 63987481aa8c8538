"""Claims: verdicts from paired differences and thresholds; every spec is well formed."""

from __future__ import annotations

import pytest

from dpbench.analysis.claims import claims_markdown, evaluate_claim
from dpbench.analysis.reproduce import PAPERS, load_spec


def _runs(method, values, **extra):
    return [{"method_name": method, "seed": s, "status": "completed", "target_epsilon": 1.0,
             "metrics": {"accuracy": v}, **extra} for s, v in enumerate(values)]


CLAIM = {"claim": "a beats b", "metric": "accuracy", "method": "a", "baseline": "b",
         "where": {"target_epsilon": [1.0]}}


@pytest.mark.parametrize(("a", "b", "verdict"), [
    ([0.9, 0.91, 0.92], [0.8, 0.82, 0.81], "reproduced"),
    ([0.8, 0.82, 0.81], [0.9, 0.91, 0.92], "contradicted"),
    ([0.9, 0.8, 0.85], [0.85, 0.85, 0.85], "inconclusive"),
])
def test_difference_claim_verdicts(a, b, verdict):
    row = evaluate_claim(CLAIM, _runs("a", a) + _runs("b", b))
    assert row["verdict"] == verdict and "(n=3)" in row["measured"]


def test_claims_markdown_lists_every_claim_with_its_verdict():
    rows = [{**evaluate_claim(CLAIM, _runs("a", [0.9, 0.91, 0.92]) + _runs("b", [0.8] * 3)),
             "paper": "P", "paper_value": "+1 | 2", "command": "make reproduce-p"},
            {**evaluate_claim(CLAIM, []), "paper": "P", "paper_value": "x", "command": "c"}]
    text = claims_markdown(rows)
    assert text.count("\n| P |") == 2 and "+1 \\| 2" in text
    assert "1 reproduced, 0 contradicted, 0 inconclusive, 1 not run" in text


def test_claim_without_runs_is_not_run_and_thresholds_use_the_ci():
    assert evaluate_claim(CLAIM, [])["verdict"] == "not run"
    value = {"claim": "x", "kind": "value", "metric": "accuracy", "method": "a",
             "threshold": 0.5, "expect": "above"}
    assert evaluate_claim(value, _runs("a", [0.6, 0.62, 0.61]))["verdict"] == "reproduced"
    assert evaluate_claim(value, _runs("a", [0.4, 0.42, 0.41]))["verdict"] == "contradicted"
    nested = {**value, "metric": "method_summary.share"}
    runs = [{**r, "method_summary": {"share": v}} for r, v in
            zip(_runs("a", [0, 0, 0]), [0.7, 0.8, 0.75])]
    assert evaluate_claim(nested, runs)["verdict"] == "reproduced"


@pytest.mark.parametrize("paper", PAPERS)
def test_reproduction_specs_are_complete(paper):
    spec = load_spec(paper)
    assert spec["claims"] and spec["sweeps"] and {"cpu", "paper"} <= set(spec["scales"])
    for claim in spec["claims"]:
        assert {"claim", "paper_value", "metric"} <= set(claim)
        assert evaluate_claim(claim, [])["verdict"] == "not run"


def test_reproduce_shares_its_parallelism_with_every_sweep(tmp_path):
    """--jobs reaches both kinds of sweep: tuned cells (dpbench-tune --jobs) and plain sweeps
    (the joblib launcher); the default is one job per core at cpu scale, one at paper scale."""
    from dpbench.analysis.reproduce import default_jobs, parse_args, sweep_commands
    from dpbench.utils.threads import available_cores

    args = parse_args(["fiber", "bounded_adaclip", "--jobs", "2", "--out", str(tmp_path)])
    jobs = [job for paper in args.papers for job in sweep_commands(load_spec(paper), args,
                                                                   tmp_path / paper)]
    tuned = [job["tune"] for job in jobs if "tune" in job]
    plain = [job["cmd"] for job in jobs if "cmd" in job]
    assert tuned and plain
    assert all(argv[argv.index("--jobs") + 1] == "2" for argv in tuned)
    assert all("hydra.launcher.n_jobs=2" in cmd for cmd in plain)
    assert default_jobs("cpu") == min(available_cores(), 8) and default_jobs("paper") == 1
    with pytest.raises(SystemExit):
        parse_args(["fiber", "--jobs", "0"])
