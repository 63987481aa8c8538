"""Steps-to-target: first step reaching the baseline's final accuracy, speed-up, epsilon saved."""

from __future__ import annotations

import json
import math

import pytest

from dpbench.analysis.results import load_records
from dpbench.analysis.steps_to_target import compare_to_baseline, summarise


def _record(method: str, seed: int, accs: list[float], history_acc: float | None = None):
    steps = [3 * (i + 1) for i in range(len(accs))]
    rows = [{"step": s, "epsilon": 0.1 * s, "accuracy": a} for s, a in zip(steps, accs)]
    history = [{"epoch": 1, "step": steps[-1] + 1, "epsilon": 0.1 * (steps[-1] + 1),
                "accuracy": history_acc if history_acc is not None else accs[-1]}]
    return {"status": "completed", "method": method, "method_name": method, "dataset": "sst2",
            "model": "minilm_lora", "seed": seed, "epsilon": history[0]["epsilon"],
            "step_history": rows, "history": history,
            "config": {"method": {"name": method}, "privacy": {"name": "eps3"}, "seed": seed}}


def test_compare_uses_final_baseline_accuracy_and_epsilon():
    base = _record("dplora", 0, [0.5, 0.6, 0.7], history_acc=0.72)  # final row: step 10
    meth = _record("spectral_denoise", 0, [0.55, 0.73, 0.74])
    out = compare_to_baseline(base, meth)
    assert out["target"] == 0.72 and out["baseline_steps"] == 10 and out["steps"] == 6
    assert out["baseline_peak"] == 0.72 and out["method_peak"] == 0.74
    assert math.isclose(out["speedup_pct"], 40.0)
    assert math.isnan(out["epsilon_saved"])  # no ledger: re-derived, never read
    never = compare_to_baseline(base, _record("spectral_denoise", 0, [0.5, 0.6, 0.71]))
    assert not never["reached"] and math.isnan(never["speedup_pct"])


def test_summarise_pairs_seeds_from_results_files(tmp_path):
    runs = [_record("dplora", 0, [0.5, 0.7]), _record("spectral_denoise", 0, [0.7, 0.8]),
            _record("dplora", 1, [0.5, 0.6]), _record("spectral_denoise", 1, [0.5, 0.6]),
            _record("dplora", 2, [0.5, 0.6])]  # seed 2 has no partner: left out
    for i, r in enumerate(runs):
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "results.json").write_text(json.dumps(r))
    rows = summarise(load_records(tmp_path))
    assert len(rows) == 1 and rows[0]["seeds"] == 2 and rows[0]["reached"] == "2/2"
    assert rows[0]["speed-up %"].startswith("35.7")  # mean of 1 - 3/7 and 1 - 6/7


def test_summarise_reads_completed_runs_only(tmp_path):
    """The runs are read by the one reader at its default, status ``completed`` (the status
    records have): a run still running or failed is no seed, even with a step history."""
    runs = {"base": _record("dplora", 0, [0.5, 0.7]),
            "method": _record("spectral_denoise", 0, [0.7, 0.8]),
            "running": {**_record("dplora", 1, [0.5, 0.6]), "status": "running"},
            "failed": {**_record("spectral_denoise", 1, [0.5, 0.6]), "status": "failed"}}
    for name, r in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(r))
    rows = summarise(load_records(tmp_path))
    assert len(rows) == 1 and rows[0]["seeds"] == 1


def test_a_run_without_a_ledger_has_no_epsilon_saved():
    """Its history epsilons are not read: nothing derives them."""
    out = compare_to_baseline(_record("dplora", 0, [0.5, 0.6, 0.7]),
                              _record("spectral_denoise", 0, [0.55, 0.73, 0.74]))
    assert out["reached"] and math.isnan(out["epsilon_saved"])


@pytest.fixture(scope="module")
def evaluated_run(tmp_path_factory):
    """A real 2-epoch dpsgd run evaluated every 4 steps: its record, ledger included."""
    from dpbench.cli import hydra_main
    from tests.helpers.cli import run_cli

    run_dir = tmp_path_factory.mktemp("steps") / "run"
    mp = pytest.MonkeyPatch()
    try:
        code = run_cli(hydra_main, ["dataset=digits", "model=logreg", "method=dpsgd",
                                    "privacy=eps3", "trainer.epochs=2", "trainer.batch_size=128",
                                    "trainer.eval_every_steps=4", f"hydra.run.dir={run_dir}"], mp)
    finally:
        mp.undo()
    assert code == 0
    return json.loads((run_dir / "results.json").read_text())


@pytest.mark.integration
def test_edited_history_epsilons_never_reach_the_table(evaluated_run):
    """Before, the epsilon saved was read from ``step_history``: editing it moved the figure
    (1.22 to 2.99 in the re-test). Now it is re-derived from the ledger."""
    from dpbench.analysis.steps_to_target import curve, epsilon_at

    record = evaluated_run
    assert len(record["step_history"]) >= 3
    last = curve(record)[-1]["step"]  # the baseline's final evaluation
    assert math.isclose(epsilon_at(record, record["steps"]), record["epsilon"], rel_tol=1e-6)
    for row in curve(record):  # what the run wrote is what the ledger gives
        assert math.isclose(epsilon_at(record, row["step"]), row["epsilon"], rel_tol=1e-6)
    true = compare_to_baseline(record, record)
    edited = json.loads(json.dumps(record))
    for row in edited["step_history"] + edited["history"]:
        row["epsilon"] = 0.01 if row["step"] < last else 99.0
    forged = compare_to_baseline(edited, edited)
    assert forged["epsilon_saved"] == true["epsilon_saved"]
    assert forged["baseline_epsilon"] == true["baseline_epsilon"]
    assert math.isclose(true["baseline_epsilon"], epsilon_at(record, last))
